// Package envoycheck validates Sluice's Envoy bootstrap (envoy.yaml)
// without running Envoy.
//
// The file is decoded into go-control-plane's Bootstrap with protojson, so
// unknown fields and wrongly typed values are refused as Envoy would refuse
// them. Every message, including every message packed in an Any (the HTTP
// connection manager, each HTTP filter, cluster protocol options), is then
// checked against Envoy's protoc-gen-validate rules. Last come the checks no
// proto can express: referenced clusters exist, the router is the last HTTP
// filter, the Sluice plugin is loaded from build/plugin.wasm with a JSON
// configuration that rules.ParseConfig accepts, its bridge cluster speaks
// HTTP/2, and the connection manager's client address and path settings
// agree with what the plugin assumes.
package envoycheck

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"sigs.k8s.io/yaml"

	// Typed configs that may appear in an Any must be registered for
	// protojson to decode them; unregistered ones are refused by name.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/header_mutation/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/jwt_authn/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "google.golang.org/protobuf/types/known/structpb"
	_ "google.golang.org/protobuf/types/known/wrapperspb"
)

// PluginPath is where envoy.yaml loads the plugin from, relative to the
// directory Envoy runs in (the repository root, after `make wasm`).
const PluginPath = "build/plugin.wasm"

// Check validates an Envoy bootstrap written in YAML (or JSON). It returns
// nil, or an error joining every problem found, each naming where it is
// (static_resources.clusters[0](sluice_bridge).connect_timeout: ...).
// A file that does not decode at all yields that one decoding error.
func Check(yamlBytes []byte) error {
	js, err := yaml.YAMLToJSON(yamlBytes)
	if err != nil {
		return fmt.Errorf("not valid YAML: %w", err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		return fmt.Errorf("does not decode as envoy.config.bootstrap.v3.Bootstrap%s: %w", yamlLines(yamlBytes, err), err)
	}
	c := &checker{}
	c.validate("", &b)
	c.crossCheck(&b)
	return errors.Join(c.problems...)
}

// fieldInError finds the field a protojson error names: its positions
// are offsets into the converted JSON, useless to someone editing YAML.
var fieldInError = regexp.MustCompile(`(?:unknown field|field) "?([A-Za-z0-9_@.]+)"?`)

// yamlLines returns " (line 12)" for the YAML lines that hold the field
// err names, or "" when it names none or the field cannot be found.
func yamlLines(src []byte, err error) string {
	m := fieldInError.FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	// protojson names some fields by their JSON name (codecType).
	field := snakePath(m[1])
	var lines []string
	for i, line := range strings.Split(string(src), "\n") {
		t := strings.TrimLeft(strings.TrimSpace(line), "- ")
		t = strings.Trim(t, `"'`)
		if strings.HasPrefix(t, field) {
			rest := strings.TrimLeft(strings.TrimPrefix(t, field), `"' `)
			if strings.HasPrefix(rest, ":") {
				lines = append(lines, strconv.Itoa(i+1))
			}
		}
	}
	if len(lines) == 0 {
		return ""
	}
	return " (" + field + " at line " + strings.Join(lines, ", ") + ")"
}

// Problem is one finding of Check, at a field path.
type Problem struct {
	Where string
	What  string
}

func (p *Problem) Error() string {
	if p.Where == "" {
		return p.What
	}
	return p.Where + ": " + p.What
}

type checker struct{ problems []error }

func (c *checker) addf(where, format string, args ...any) {
	c.problems = append(c.problems, &Problem{Where: where, What: fmt.Sprintf(format, args...)})
}

// validate runs the message's own validation rules, then descends into it
// to reach the Anys, which protoc-gen-validate does not open.
func (c *checker) validate(path string, m proto.Message) {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			c.flatten(path, err)
		}
	}
	c.walk(path, m.ProtoReflect())
}

// walk visits every message-typed field of m, in field order, with map
// keys sorted so that problems come out in the same order every time.
func (c *checker) walk(path string, m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := join(path, string(fd.Name()))
		switch {
		case fd.IsList():
			if fd.Kind() != protoreflect.MessageKind {
				break
			}
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				e := l.Get(i).Message()
				c.message(indexName(name, i, e), e)
			}
		case fd.IsMap():
			if fd.MapValue().Kind() != protoreflect.MessageKind {
				break
			}
			mp := v.Map()
			keys := make([]string, 0, mp.Len())
			vals := map[string]protoreflect.Message{}
			mp.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
				ks := k.String()
				keys = append(keys, ks)
				vals[ks] = v.Message()
				return true
			})
			sort.Strings(keys)
			for _, k := range keys {
				c.message(name+"["+k+"]", vals[k])
			}
		case fd.Kind() == protoreflect.MessageKind:
			c.message(name, v.Message())
		}
		return true
	})
}

// message unpacks an Any and validates its content as a message of its
// own; other messages were validated with their parent and are walked.
func (c *checker) message(path string, m protoreflect.Message) {
	a, ok := m.Interface().(*anypb.Any)
	if !ok {
		c.walk(path, m)
		return
	}
	inner, err := a.UnmarshalNew()
	if err != nil {
		c.addf(path, "cannot unpack %s: %v", a.GetTypeUrl(), err)
		return
	}
	c.validate(path, inner)
}

// fieldError and multiError are the shapes of protoc-gen-validate errors;
// each message type has its own concrete types.
type fieldError interface {
	Field() string
	Reason() string
	Cause() error
}

type multiError interface{ AllErrors() []error }

// flatten turns nested validation errors ("embedded message failed
// validation", caused by ...) into one problem per failing field, with the
// proto field path as written in YAML.
func (c *checker) flatten(path string, err error) {
	switch e := err.(type) {
	case multiError:
		for _, e := range e.AllErrors() {
			c.flatten(path, e)
		}
	case fieldError:
		fe := e
		p := join(path, snakePath(fe.Field()))
		if cause := fe.Cause(); cause != nil {
			c.flatten(p, cause)
			return
		}
		c.addf(p, "%s", fe.Reason())
	default:
		c.addf(path, "%v", err)
	}
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

// indexName names a list element, with its name field when it has one:
// clusters[1](upstream) reads better than clusters[1].
func indexName(path string, i int, m protoreflect.Message) string {
	s := fmt.Sprintf("%s[%d]", path, i)
	if fd := m.Descriptor().Fields().ByName("name"); fd != nil && fd.Kind() == protoreflect.StringKind && !fd.IsList() {
		if n := m.Get(fd).String(); n != "" {
			s += "(" + n + ")"
		}
	}
	return s
}

// snakePath turns a validation field such as "Clusters[0]" or
// "Http2ProtocolOptions" into the proto field name used in YAML.
func snakePath(field string) string {
	name, rest := field, ""
	if i := strings.IndexByte(field, '['); i >= 0 {
		name, rest = field[:i], field[i:]
	}
	var b strings.Builder
	for i := 0; i < len(name); i++ {
		ch := name[i]
		if ch >= 'A' && ch <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			ch += 'a' - 'A'
		}
		b.WriteByte(ch)
	}
	return b.String() + rest
}

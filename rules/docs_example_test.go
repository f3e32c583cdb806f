package rules

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// These tests keep docs/config.md true to ParseConfig: every ```json block
// in it is a complete configuration that parses, every documented error is
// the error ParseConfig gives, and every field ParseConfig knows is
// documented. Fragments are fenced as ```jsonc and are not checked.

const configDoc = "../docs/config.md"

type fence struct {
	info string
	line int // 1-based line of the opening fence
	body string
}

func readFences(t *testing.T, path string) []fence {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		out  []fence
		cur  *fence
		body strings.Builder
	)
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if !strings.HasPrefix(line, "```") {
			if cur != nil {
				body.WriteString(line)
				body.WriteByte('\n')
			}
			continue
		}
		if cur == nil {
			cur = &fence{info: strings.TrimSpace(line[3:]), line: n}
			body.Reset()
			continue
		}
		cur.body = body.String()
		out = append(out, *cur)
		cur = nil
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: code fence never closed", path, cur.line)
	}
	return out
}

func TestParseConfig_DocExamples(t *testing.T) {
	n := 0
	for _, f := range readFences(t, configDoc) {
		if f.info != "json" {
			continue
		}
		n++
		if !strings.HasPrefix(strings.TrimSpace(f.body), "{") {
			t.Errorf("docs/config.md:%d: a json block must be a complete configuration; fence fragments as jsonc", f.line)
			continue
		}
		if _, err := ParseConfig([]byte(f.body)); err != nil {
			t.Errorf("docs/config.md:%d: %v", f.line, err)
		}
	}
	// A lower count means blocks were lost or mis-fenced, and then this
	// test would check less than the document shows.
	if n < 20 {
		t.Errorf("docs/config.md has %d json examples, want at least 20", n)
	}
}

// TestParseConfig_DocErrors checks the "config:" / "error:" pairs of the
// document's text blocks against ParseConfig.
func TestParseConfig_DocErrors(t *testing.T) {
	n := 0
	for _, f := range readFences(t, configDoc) {
		if f.info != "text" {
			continue
		}
		lines := strings.Split(f.body, "\n")
		for i := 0; i < len(lines); i++ {
			cfg, ok := strings.CutPrefix(lines[i], "config: ")
			if !ok {
				continue
			}
			if i+1 >= len(lines) || !strings.HasPrefix(lines[i+1], "error:") {
				t.Errorf("docs/config.md:%d: config line without an error line after it", f.line+1+i)
				continue
			}
			want := strings.TrimSpace(strings.TrimPrefix(lines[i+1], "error:"))
			n++
			_, err := ParseConfig([]byte(cfg))
			if err == nil {
				t.Errorf("docs/config.md:%d: %s parses, the document says it fails with %q", f.line+1+i, cfg, want)
			} else if err.Error() != want {
				t.Errorf("docs/config.md:%d: %s\n got: %v\nwant: %s", f.line+1+i, cfg, err, want)
			}
		}
	}
	if n < 10 {
		t.Errorf("docs/config.md has %d documented errors, want at least 10", n)
	}
}

// TestParseConfig_DocCoversFields asks ParseConfig for the known fields of
// every object (through its unknown-field error) and requires each to be
// documented as `field`, so a new field cannot ship undocumented.
func TestParseConfig_DocCoversFields(t *testing.T) {
	doc, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	// Each config puts the unknown field zz into one object.
	for _, cfg := range []string{
		`{"zz":1}`,
		`{"bridge":{"zz":1}}`,
		`{"identity":{"zz":1}}`,
		`{"identity":{"sources":[{"zz":1}]}}`,
		`{"identity":{"sources":[{"type":"jwt","keys":[{"zz":1}]}]}}`,
		`{"identity":{"client_ip":{"zz":1}}}`,
		`{"tiers":{"zz":1}}`,
		`{"tiers":{"list":[{"zz":1}]}}`,
		`{"tiers":{"list":[{"name":"t","limit":1,"window":"1s","endpoints":{"/a":{"zz":1}}}]}}`,
		`{"categories":[{"zz":1}]}`,
		`{"rules":[{"zz":1}]}`,
		`{"rules":[{"name":"r","limit":1,"window":"1s","lease":{"zz":1}}]}`,
		`{"rules_from":{"zz":1}}`,
		`{"rules":[{"name":"r","match":{"zz":1}}]}`,
		`{"rules":[{"name":"r","match":{"headers":[{"zz":1}]}}]}`,
		`{"exemptions":{"zz":1}}`,
		`{"penalty":{"zz":1}}`,
		`{"headers":{"zz":1}}`,
		`{"deny":{"zz":1}}`,
		`{"local_cache":{"zz":1}}`,
	} {
		_, err := ParseConfig([]byte(cfg))
		if err == nil {
			t.Errorf("%s: parsed, want an unknown field error", cfg)
			continue
		}
		_, known, ok := strings.Cut(err.Error(), "unknown field (known: ")
		if !ok {
			t.Errorf("%s: %v, want an unknown field error", cfg, err)
			continue
		}
		for _, f := range strings.Split(strings.TrimSuffix(known, ")"), ", ") {
			if !strings.Contains(string(doc), "`"+f+"`") {
				t.Errorf("docs/config.md does not document field `%s` (%s)", f, cfg)
			}
		}
	}
}

func TestParseConfig_Examples(t *testing.T) {
	paths, err := filepath.Glob("../examples/config*.json")
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) == 0 {
		t.Fatal("no examples/config*.json")
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ParseConfig(data); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}

// The README's configuration example is a complete, valid configuration.
func TestParseConfig_ReadmeExample(t *testing.T) {
	n := 0
	for _, f := range readFences(t, "../README.md") {
		if f.info != "json" {
			continue
		}
		n++
		if _, err := ParseConfig([]byte(f.body)); err != nil {
			t.Errorf("README.md:%d: %v", f.line, err)
		}
	}
	if n == 0 {
		t.Error("README.md has no json configuration example")
	}
}

// The documents state the bounds the code enforces: limits per check, and
// rules and categories per configuration.
func TestDocs_Bounds(t *testing.T) {
	config, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	protocol, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	var rules []string
	for i := 0; i < MaxLimitsPerCheck; i++ {
		rules = append(rules, fmt.Sprintf(`{"name":"r%d","limit":1,"window":"1s"}`, i))
	}
	_, perr := ParseConfig([]byte(`{"rules":[` + strings.Join(rules, ",") + `]}`))
	if perr == nil {
		t.Fatalf("%d rules accepted", MaxLimitsPerCheck)
	}
	for _, want := range []string{
		"error:  " + perr.Error(),
		fmt.Sprintf("at most %d limits per check", MaxLimitsPerCheck),
		fmt.Sprintf("at most %d rules and categories", MaxLimitsPerCheck-1),
	} {
		if !strings.Contains(string(config), want) {
			t.Errorf("docs/config.md does not say %q", want)
		}
	}
	if want := fmt.Sprintf("| `limits` | array | 1 to %d limits", MaxLimitsPerCheck); !strings.Contains(string(protocol), want) {
		t.Errorf("docs/protocol.md does not say %q", want)
	}
}

// The document's complete example is examples/config.json, as it says.
func TestDocs_CompleteExampleIsTheFile(t *testing.T) {
	const intro = "This is `examples/config.json`"
	doc, err := os.ReadFile(configDoc)
	if err != nil {
		t.Fatal(err)
	}
	at := strings.Index(string(doc), intro)
	if at < 0 {
		t.Fatalf("docs/config.md no longer says %q", intro)
	}
	line := strings.Count(string(doc[:at]), "\n") + 1
	var block string
	for _, f := range readFences(t, configDoc) {
		if f.line > line && f.info == "json" {
			block = f.body
			break
		}
	}
	file, err := os.ReadFile("../examples/config.json")
	if err != nil {
		t.Fatal(err)
	}
	var inDoc, inFile any
	if err := json.Unmarshal([]byte(block), &inDoc); err != nil {
		t.Fatalf("docs/config.md, the complete example: %v", err)
	}
	if err := json.Unmarshal(file, &inFile); err != nil {
		t.Fatalf("examples/config.json: %v", err)
	}
	if !reflect.DeepEqual(inDoc, inFile) {
		t.Error("docs/config.md's complete example differs from examples/config.json")
	}
}

package rls

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v2"
)

// readYAML reads a configuration file as envoyproxy/ratelimit reads it,
// with YAML 1.1 as yaml.v2 reads it (go.yaml.in/yaml/v2 is its
// continuation): once as a tree, whose keys must be text and whose
// values, inside metadata aside, text, integers, true/false or nothing
// (a number with a fraction or an exponent is refused there), and once
// into the text fields (domain, key, value, a rate_limit's name and unit,
// a replaced name, the keys of a descriptor's metadata), which take a
// scalar as it is written: `value: 007` is the text 007 and `value: yes`
// the text yes, where the tree has the number 7 and true. A descriptor then matches the calls it matches
// there. It returns the tree with those texts in place and numbers as
// json.Number.
func readYAML(data []byte) (map[string]any, error) {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, err
	}
	if doc == nil {
		return map[string]any{}, nil // an empty file: no domain
	}
	v, err := plain(doc, "", false)
	if err != nil {
		return nil, err
	}
	top, ok := v.(map[string]any)
	if !ok {
		return nil, errors.New("want a mapping with domain and descriptors")
	}
	var texts textFile
	if err := yaml.Unmarshal(data, &texts); err != nil {
		// A text field holds a list or a mapping: reading the tree
		// names it with its path (node.load), so the error here, which
		// does not, is not the one given. Every other field was read.
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, err
		}
	}
	if err := texts.put(top); err != nil {
		return nil, err
	}
	return top, nil
}

// plain is v, a value yaml.v2 read at path, with text keys and numbers as
// json.Number; inside metadata (meta) any key is taken, as its text, and
// any finite number.
func plain(v any, path string, meta bool) (any, error) {
	switch v := v.(type) {
	case map[string]any: // a descriptor's metadata, its keys as written
		m := make(map[string]any, len(v))
		for _, k := range slices.Sorted(maps.Keys(v)) {
			c, err := plain(v[k], join(path, k), true)
			if err != nil {
				return nil, err
			}
			m[k] = c
		}
		return m, nil
	case map[any]any:
		// In the order of the keys' texts, so that a file gets the same
		// error every time; of two with one text (1 and "1", in
		// metadata), the text's value is kept.
		type key struct {
			name string
			k    any
			text bool
		}
		keys := make([]key, 0, len(v))
		for k := range v {
			_, text := k.(string)
			keys = append(keys, key{fmt.Sprint(k), k, text})
		}
		slices.SortFunc(keys, func(a, b key) int {
			if c := strings.Compare(a.name, b.name); c != 0 || a.text == b.text {
				return c
			}
			if a.text {
				return 1 // the text after the other, so its value is kept
			}
			return -1
		})
		m := make(map[string]any, len(v))
		for _, kk := range keys {
			name, k := kk.name, kk.k
			if !kk.text && !meta {
				return nil, fmt.Errorf("%s: a key must be text", join(path, name))
			}
			c, err := plain(v[k], join(path, name), meta || name == "metadata")
			if err != nil {
				return nil, err
			}
			m[name] = c
		}
		return m, nil
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			c, err := plain(e, fmt.Sprintf("%s[%d]", path, i), meta)
			if err != nil {
				return nil, err
			}
			out[i] = c
		}
		return out, nil
	case string, bool, nil:
		return v, nil
	case int:
		return json.Number(strconv.Itoa(v)), nil
	case uint64: // above the largest int64
		if meta {
			return json.Number(strconv.FormatUint(v, 10)), nil
		}
	case float64:
		if meta && !math.IsInf(v, 0) && !math.IsNaN(v) {
			return json.Number(strconv.FormatFloat(v, 'g', -1, 64)), nil
		}
	}
	return nil, fmt.Errorf("%s: YAML reads this as the number %v, which envoyproxy/ratelimit refuses here (a fraction, an exponent, or beyond 64 bits); quote it to write text", path, v)
}

// textFile and the types below are a file's text fields, as yaml.v2
// gives a string field a scalar: as written.
type textFile struct {
	Domain      string
	Descriptors []textDescriptor
}

type textDescriptor struct {
	Key, Value  string
	RateLimit   *textLimit `yaml:"rate_limit"`
	Descriptors []textDescriptor
	// Its keys as written; below them, keys are the text of what YAML
	// reads (metadata: {on: {on: 1}} is {"on": {"true": 1}}), as there.
	Metadata map[string]any
}

type textLimit struct {
	Name, Unit string
	Replaces   []struct{ Name string }
}

// put writes f's texts over the numbers and true/false at their places in
// top, and a descriptor's metadata with its keys as written. A list
// yaml.v2 could not read whole into f (an entry that is not a mapping)
// lines up with top's only up to that entry, which node.load refuses
// before it reads any after it.
func (f *textFile) put(top map[string]any) error {
	putText(top, "domain", f.Domain)
	return putDescriptors(top["descriptors"], "descriptors", f.Descriptors)
}

func putDescriptors(list any, path string, texts []textDescriptor) error {
	items, _ := list.([]any)
	for i := range min(len(items), len(texts)) {
		d, ok := items[i].(map[string]any)
		if !ok {
			continue
		}
		t := &texts[i]
		at := fmt.Sprintf("%s[%d]", path, i)
		if _, ok := d["metadata"].(map[string]any); ok && t.Metadata != nil {
			m, err := plain(t.Metadata, at+".metadata", true)
			if err != nil {
				return err
			}
			d["metadata"] = m
		}
		putText(d, "key", t.Key)
		putText(d, "value", t.Value)
		if rl, ok := d["rate_limit"].(map[string]any); ok && t.RateLimit != nil {
			putText(rl, "name", t.RateLimit.Name)
			putText(rl, "unit", t.RateLimit.Unit)
			reps, _ := rl["replaces"].([]any)
			for j := range min(len(reps), len(t.RateLimit.Replaces)) {
				if r, ok := reps[j].(map[string]any); ok {
					putText(r, "name", t.RateLimit.Replaces[j].Name)
				}
			}
		}
		if err := putDescriptors(d["descriptors"], at+".descriptors", t.Descriptors); err != nil {
			return err
		}
	}
	return nil
}

// putText puts text at m[field] where the tree has a number or true/false.
func putText(m map[string]any, field, text string) {
	switch m[field].(type) {
	case json.Number, bool:
		m[field] = text
	}
}

package fields

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestMap_AppendParse(t *testing.T) {
	tests := []struct {
		name string
		in   Map
		want []byte
	}{
		{"empty", nil, nil},
		{"spec example", Map{{"a", "1"}, {"b", "22"}}, []byte{
			2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0,
			'a', 0, '1', 0, 'b', 0, '2', '2', 0}},
		{"empty value", Map{{"x", ""}}, []byte{1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'x', 0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.in.Append(nil)
			if !bytes.Equal(got, tt.want) {
				t.Fatalf("Append = %v, want %v", got, tt.want)
			}
			back, err := Parse(got)
			if err != nil {
				t.Fatal(err)
			}
			if len(back) != len(tt.in) || (len(back) > 0 && !reflect.DeepEqual(back, tt.in)) {
				t.Fatalf("Parse = %v, want %v", back, tt.in)
			}
		})
	}
}

func TestParse_Malformed(t *testing.T) {
	for name, b := range map[string][]byte{
		"short":         {1, 0},
		"count too big": {9, 0, 0, 0, 0, 0, 0, 0},
		"missing nul":   {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 'x', '1', 0},
		"trailing":      {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 0, '1', 0, 9},
		"huge length":   {1, 0, 0, 0, 255, 255, 255, 255, 1, 0, 0, 0, 'a', 0},
	} {
		if _, err := Parse(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
	if m, err := Parse([]byte{0}); err != nil || len(m) != 0 {
		t.Errorf("single zero byte: %v %v", m, err)
	}
}

func TestMap_Mutations(t *testing.T) {
	m := FromPairs([][2]string{{"A", "1"}, {"b", "2"}, {"a", "3"}})
	if v, ok := m.Get("a"); !ok || v != "1" {
		t.Fatalf("Get a = %q %v", v, ok)
	}
	m.Replace("A", "9")
	if !reflect.DeepEqual(m, Map{{"a", "9"}, {"b", "2"}}) {
		t.Fatalf("Replace: %v", m)
	}
	m.Add("c", "x")
	m.Remove("b")
	m.Remove("nope")
	if !reflect.DeepEqual(m, Map{{"a", "9"}, {"c", "x"}}) {
		t.Fatalf("Add/Remove: %v", m)
	}
	m.Replace("d", "new")
	if v, _ := m.Get("D"); v != "new" {
		t.Fatalf("Replace absent: %v", m)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte{})
	f.Add(Map{{"a", "1"}, {"b", "22"}}.Append(nil))
	f.Add([]byte{1, 0, 0, 0, 255, 255, 255, 255, 1, 0, 0, 0, 'a', 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		var visited Map
		verr := Visit(b, func(k, v []byte) { visited = append(visited, [2]string{strings.ToLower(string(k)), string(v)}) })
		if (err == nil) != (verr == nil) {
			t.Fatalf("Parse: %v, Visit: %v", err, verr)
		}
		if err != nil {
			if len(visited) > 0 {
				t.Fatalf("Visit saw %v of a malformed map", visited)
			}
			return
		}
		if !reflect.DeepEqual(visited, m) && (len(visited) > 0 || len(m) > 0) {
			t.Fatalf("Visit saw %v, Parse %v", visited, m)
		}
		// A parsed map re-serializes to the same map.
		back, err := Parse(m.Append(nil))
		if err != nil || !reflect.DeepEqual(back, m) {
			t.Fatalf("round trip: %v %v, want %v", back, err, m)
		}
	})
}

package fields

import (
	"errors"
	"reflect"
	"testing"
)

// Parse lower-cases the names a guest wrote, and refuses what pwmap
// refuses (the layout's own tests are there).
func TestParse(t *testing.T) {
	m, err := Parse(Map{{"X-A", "1"}, {"b", "V"}}.Append(nil))
	if err != nil || !reflect.DeepEqual(m, Map{{"x-a", "1"}, {"b", "V"}}) {
		t.Errorf("Parse = %v, %v", m, err)
	}
	if _, err := Parse([]byte{1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 0, '1', 0, 9}); !errors.Is(err, ErrMalformed) {
		t.Errorf("trailing byte: err = %v, want ErrMalformed", err)
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

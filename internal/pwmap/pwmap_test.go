package pwmap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

func TestAppend(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pairs [][2]string
		want  []byte
	}{
		{"empty", nil, nil},
		{"spec example", [][2]string{{"a", "1"}, {"b", "22"}}, []byte{
			2, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0,
			'a', 0, '1', 0, 'b', 0, '2', '2', 0}},
		{"empty value", [][2]string{{"x", ""}}, []byte{1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 'x', 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Append(nil, tc.pairs)
			if !bytes.Equal(got, tc.want) {
				t.Fatalf("Append = %v, want %v", got, tc.want)
			}
			if back := pairs(t, got); !reflect.DeepEqual(back, tc.pairs) {
				t.Fatalf("Visit = %v, want %v", back, tc.pairs)
			}
		})
	}
}

func TestVisit_Malformed(t *testing.T) {
	for name, b := range map[string][]byte{
		"short":            {1, 0},
		"count too big":    {9, 0, 0, 0, 0, 0, 0, 0},
		"missing key nul":  {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 'x', '1', 0},
		"missing last nul": {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 0, '1', 1},
		"trailing":         {1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 'a', 0, '1', 0, 9},
		"huge length":      {1, 0, 0, 0, 255, 255, 255, 255, 1, 0, 0, 0, 'a', 0},
	} {
		called := false
		if err := Visit(b, func(_, _ []byte) { called = true }); !errors.Is(err, ErrMalformed) || called {
			t.Errorf("%s: err = %v, fn called: %v; want ErrMalformed, not called", name, err, called)
		}
	}
	for _, b := range [][]byte{nil, {0}, {0, 0, 0, 0}} {
		if n, err := Len(b); n != 0 || err != nil {
			t.Errorf("%v: Len = %d, %v; want the empty map", b, n, err)
		}
	}
}

// pairs is what Visit sees of b, copied.
func pairs(t *testing.T, b []byte) [][2]string {
	t.Helper()
	var out [][2]string
	if err := Visit(b, func(k, v []byte) { out = append(out, [2]string{string(k), string(v)}) }); err != nil {
		t.Fatal(err)
	}
	return out
}

// decode reads b the plain way, one field after the other, as a reference
// for Visit: the pairs, and whether b is a map.
func decode(b []byte) ([][2]string, bool) {
	if len(b) == 0 || (len(b) == 1 && b[0] == 0) {
		return nil, true
	}
	if len(b) < 4 {
		return nil, false
	}
	n := int(binary.LittleEndian.Uint32(b))
	b = b[4:]
	if n > len(b)/8 {
		return nil, false
	}
	lens := make([]int, 2*n)
	for i := range lens {
		lens[i] = int(binary.LittleEndian.Uint32(b))
		b = b[4:]
	}
	var out [][2]string
	var pair [2]string
	for i, l := range lens {
		if l >= len(b) || b[l] != 0 {
			return nil, false
		}
		pair[i%2] = string(b[:l])
		b = b[l+1:]
		if i%2 == 1 {
			out = append(out, pair)
		}
	}
	if len(b) != 0 {
		return nil, false
	}
	return out, true
}

// FuzzVisit: Visit and Pairs read what the plain reading does, or refuse
// what it refuses, and Append writes a map back as it was.
func FuzzVisit(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0})
	f.Add(Append(nil, [][2]string{{"a", "1"}, {"b", "22"}}))
	f.Add([]byte{1, 0, 0, 0, 255, 255, 255, 255, 1, 0, 0, 0, 'a', 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		want, ok := decode(b)
		var got [][2]string
		err := Visit(b, func(k, v []byte) { got = append(got, [2]string{string(k), string(v)}) })
		n, lerr := Len(b)
		if (err == nil) != ok || (lerr == nil) != ok || !reflect.DeepEqual(got, want) || (ok && n != len(want)) {
			t.Fatalf("%v: Visit %v, %v; Len %d, %v; want %v, map %v", b, got, err, n, lerr, want, ok)
		}
		if p, perr := Pairs(b); (perr == nil) != ok || !reflect.DeepEqual(p, want) {
			t.Fatalf("%v: Pairs %v, %v; want %v, map %v", b, p, perr, want, ok)
		}
		if ok && len(want) > 0 && !bytes.Equal(Append(nil, want), b) {
			t.Fatalf("%v: written back as %v", b, Append(nil, want))
		}
	})
}

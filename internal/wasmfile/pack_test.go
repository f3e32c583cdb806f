package wasmfile

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"

	"github.com/tetratelabs/wazero"
)

// seg is a data segment of a test module: active at offset, or passive.
type seg struct {
	offset  int32
	data    string
	passive bool
}

// testModule is a module with one memory of a page, exported as "memory",
// and segs; with a data count section when dataCount, and a name section
// naming its first data segment when namedData.
func testModule(segs []seg, dataCount, namedData bool) []byte {
	section := func(dst []byte, id byte, body []byte) []byte {
		dst = append(dst, id)
		return append(binary.AppendUvarint(dst, uint64(len(body))), body...)
	}
	m := []byte("\x00asm\x01\x00\x00\x00")
	m = section(m, 5, []byte{1, 0, 1})                                  // a memory of min 1 page
	m = section(m, 7, []byte{1, 6, 'm', 'e', 'm', 'o', 'r', 'y', 2, 0}) // exported
	if dataCount {
		m = section(m, 12, binary.AppendUvarint(nil, uint64(len(segs))))
	}
	data := binary.AppendUvarint(nil, uint64(len(segs)))
	for _, s := range segs {
		if s.passive {
			data = append(data, 1)
		} else {
			data = append(appendS32(append(data, 0, opI32Const), s.offset), opEnd)
		}
		data = append(binary.AppendUvarint(data, uint64(len(s.data))), s.data...)
	}
	m = section(m, 11, data)
	if namedData {
		names := append([]byte{4}, "name"...)
		names = append(names, 9, 4, 1, 0, 1, 'd') // data names: one, segment 0 "d"
		m = section(m, 0, names)
	}
	return m
}

// memoryOf instantiates wasm on wazero and returns its memory's bytes.
func memoryOf(t testing.TB, wasm []byte) []byte {
	t.Helper()
	ctx := context.Background()
	rt := wazero.NewRuntime(ctx)
	defer rt.Close(ctx)
	mod, err := rt.Instantiate(ctx, wasm)
	if err != nil {
		t.Fatalf("instantiating: %v", err)
	}
	mem, ok := mod.Memory().Read(0, mod.Memory().Size())
	if !ok {
		t.Fatal("memory not readable")
	}
	return bytes.Clone(mem)
}

// segmentCount is DataSegmentCount, failing t on an error.
func segmentCount(t testing.TB, wasm []byte) int {
	t.Helper()
	n, err := DataSegmentCount(wasm)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// otherSections is wasm's sections but the data and data count ones.
func otherSections(t testing.TB, wasm []byte) [][]byte {
	t.Helper()
	var out [][]byte
	if err := sections(wasm, func(id byte, r *reader) error {
		if id != sectionData && id != sectionDataCount {
			out = append(out, append([]byte{id}, r.b...))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestPackData(t *testing.T) {
	for _, tc := range []struct {
		name      string
		segs      []seg
		maxGap    int
		dataCount bool
		want      int // segments after; 0: the module comes back as it is
	}{
		{"gaps below the bound merge", []seg{{0, "ab", false}, {4, "cd", false}, {100, "ef", false}}, 8, false, 2},
		{"a gap of the bound stays", []seg{{0, "ab", false}, {10, "cd", false}}, 8, false, 2},
		{"a gap one below the bound merges", []seg{{0, "ab", false}, {9, "cd", false}}, 8, false, 1},
		{"adjacent", []seg{{0, "ab", false}, {2, "cd", false}}, 1, false, 1},
		{"in any order", []seg{{300, "z", false}, {0, "ab", false}, {150, "m", false}, {3, "c", false}}, 200, false, 1},
		{"empty ones", []seg{{0, "", false}, {5, "x", false}, {5, "", false}, {9000, "", false}}, 16, false, 2},
		{"high in the page", []seg{{65000, "abc", false}, {65533, "end", false}}, 1024, false, 1},
		{"with a data count", []seg{{0, "ab", false}, {4, "cd", false}}, 8, true, 1},
		{"overlapping: as it is", []seg{{2, "bb", false}, {0, "aaaa", false}}, 8, false, 0},
		{"a passive one: as it is", []seg{{0, "ab", false}, {1, "p", true}}, 8, true, 0},
		{"no segment", nil, 8, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testModule(tc.segs, tc.dataCount, false)
			out, err := PackData(in, tc.maxGap)
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == 0 {
				if !bytes.Equal(out, in) {
					t.Fatal("changed")
				}
				return
			}
			if n := segmentCount(t, out); n != tc.want {
				t.Errorf("%d segments, want %d", n, tc.want)
			}
			if !bytes.Equal(memoryOf(t, out), memoryOf(t, in)) {
				t.Error("memory differs")
			}
			a, b := otherSections(t, in), otherSections(t, out)
			if len(a) != len(b) {
				t.Fatalf("%d other sections, want %d", len(b), len(a))
			}
			for i := range a {
				if !bytes.Equal(a[i], b[i]) {
					t.Errorf("section %d changed", a[i][0])
				}
			}
		})
	}
}

// A name section that names data segments keeps the module as it is;
// bytes that are no module are refused.
func TestPackData_Unchanged(t *testing.T) {
	in := testModule([]seg{{0, "ab", false}, {4, "cd", false}}, false, true)
	if out, err := PackData(in, 8); err != nil || !bytes.Equal(out, in) {
		t.Errorf("named data segments: changed (%v)", err)
	}
	if _, err := PackData([]byte("not wasm"), 8); err == nil {
		t.Error("accepted bytes that are no module")
	}
	if _, err := PackData(in[:len(in)-1], 8); err == nil {
		t.Error("accepted a truncated module")
	}
}

// A module whose segments do not fit its memory still fails to
// instantiate: an empty segment past the end too.
func TestPackData_OutOfBounds(t *testing.T) {
	for _, segs := range [][]seg{
		{{65533, "end", false}, {65537, "", false}},
		{{65533, "end", false}, {65536, "x", false}},
		{{0, "a", false}, {70000, "", false}},
	} {
		out, err := PackData(testModule(segs, false, false), 8)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		rt := wazero.NewRuntime(ctx)
		if _, err := rt.Instantiate(ctx, out); err == nil {
			t.Errorf("%+v: instantiated", segs)
		}
		rt.Close(ctx)
	}
}

func TestAppendS32(t *testing.T) {
	for _, v := range []int32{0, 1, 63, 64, -1, -64, -65, 127, 128, 8191, 8192, 1 << 30, -1 << 31, 1<<31 - 1} {
		r := &reader{b: appendS32(nil, v)}
		if got := r.s32(); got != v || r.err != nil || len(r.b) != 0 {
			t.Errorf("%d: read back %d (%v, %d left)", v, got, r.err, len(r.b))
		}
	}
}

// Whatever the segments, the packed module leaves in memory what the
// module did.
func FuzzPackData(f *testing.F) {
	f.Add([]byte{0, 2, 'a', 'b', 3, 1, 'c', 200, 0, 9, 2, 'd', 'e'}, uint16(8))
	f.Add([]byte{10, 0, 0, 0, 5, 3, 'x', 'y', 'z'}, uint16(1))
	f.Fuzz(func(t *testing.T, spec []byte, maxGap uint16) {
		// spec: per segment a gap from the last end (a byte, times 4), a
		// length and that many bytes; in reverse order every other one.
		var segs []seg
		end := int32(0)
		for len(spec) >= 2 {
			gap, n := int32(spec[0])*4, int(spec[1])
			spec = spec[2:]
			n = min(n, len(spec))
			s := seg{offset: end + gap, data: string(spec[:n])}
			spec = spec[n:]
			if s.offset+int32(len(s.data)) > 65536 {
				break
			}
			end = s.offset + int32(len(s.data))
			segs = append(segs, s)
		}
		for i := 0; i+1 < len(segs); i += 2 {
			segs[i], segs[i+1] = segs[i+1], segs[i]
		}
		in := testModule(segs, false, false)
		out, err := PackData(in, int(maxGap))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(memoryOf(t, out), memoryOf(t, in)) {
			t.Fatalf("memory differs for %+v (max gap %d)", segs, maxGap)
		}
		if segmentCount(t, out) > len(segs) {
			t.Fatalf("%d segments from %d", segmentCount(t, out), len(segs))
		}
	})
}

package wasmfile

import (
	"cmp"
	"encoding/binary"
	"slices"
)

// PageGap is the gap PackData fills for the plugin's build. Most of the
// plugin's gaps are 16 to 31 bytes; filling every gap under a page adds
// 1.1 MB of zeros to the module (next to nothing gzipped) and leaves 2
// segments of 62,052.
const PageGap = 4096

// Section ids, and the one data segment form PackData merges.
const (
	sectionCustom    = 0
	sectionImport    = 2
	sectionExport    = 7
	sectionData      = 11
	sectionDataCount = 12
	opI32Const       = 0x41
	opEnd            = 0x0b
)

// segment is an active data segment of memory 0 at a constant offset.
type segment struct {
	offset uint32
	data   []byte
}

// PackData returns wasm with its data segments merged wherever the gap
// between two is shorter than maxGap bytes, the gap written as zeros.
// Instantiating either module leaves the same bytes in memory: linear
// memory starts zeroed, and segments that do not overlap may be written in
// any order. Go's linker leaves out every run of eight zeros or more, and
// the plugin came out as 62,052 segments: every engine keeps and walks
// them for each VM it starts, and on wazero they were most of what Go's
// garbage collector marked in a gateway that embeds the plugin.
//
// Every section but the data section (and the data count section, if
// any) is kept byte for byte. A module whose segments PackData does not
// merge safely, some of them passive, of another memory, at an offset
// that is not a constant, overlapping, or named in a name section, comes
// back as it is.
func PackData(wasm []byte, maxGap int) ([]byte, error) {
	type section struct {
		id   byte
		body []byte
	}
	var secs []section
	data := -1
	named := false
	err := sections(wasm, func(id byte, r *reader) error {
		if id == sectionData {
			data = len(secs)
		}
		if id == sectionCustom && namesData(r.b) {
			named = true
		}
		secs = append(secs, section{id, r.b})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if data < 0 || named {
		return wasm, nil
	}
	segs, ok := dataSegments(secs[data].body)
	if !ok {
		return wasm, nil
	}
	slices.SortStableFunc(segs, func(a, b segment) int { return cmp.Compare(a.offset, b.offset) })
	var packed []segment
	for _, s := range segs {
		if n := len(packed); n > 0 {
			last := &packed[n-1]
			end := uint64(last.offset) + uint64(len(last.data))
			switch {
			case len(s.data) == 0 && uint64(s.offset) <= end:
				continue // writes nothing, and is in bounds where last is
			case uint64(s.offset) < end:
				return wasm, nil // overlapping: the order they are written in counts
			case uint64(s.offset)-end < uint64(maxGap):
				last.data = append(append(last.data, make([]byte, uint64(s.offset)-end)...), s.data...)
				continue
			}
		}
		packed = append(packed, segment{s.offset, slices.Clone(s.data)})
	}
	out := slices.Clone(wasm[:8])
	for _, s := range secs {
		body := s.body
		switch s.id {
		case sectionData:
			body = binary.AppendUvarint(nil, uint64(len(packed)))
			for _, p := range packed {
				body = append(body, 0, opI32Const) // active, memory 0
				body = appendS32(body, int32(p.offset))
				body = append(body, opEnd)
				body = binary.AppendUvarint(body, uint64(len(p.data)))
				body = append(body, p.data...)
			}
		case sectionDataCount:
			body = binary.AppendUvarint(nil, uint64(len(packed)))
		}
		out = append(out, s.id)
		out = binary.AppendUvarint(out, uint64(len(body)))
		out = append(out, body...)
	}
	return out, nil
}

// DataSegmentCount returns the number of data segments of a module, 0
// when it has no data section.
func DataSegmentCount(wasm []byte) (int, error) {
	n := 0
	err := sections(wasm, func(id byte, r *reader) error {
		if id == sectionData {
			n = int(r.u32())
		}
		return r.err
	})
	return n, err
}

// dataSegments reads a data section, reporting false for a segment other
// than an active one of memory 0 at an i32.const offset.
func dataSegments(body []byte) ([]segment, bool) {
	r := &reader{b: body}
	n := r.u32()
	segs := make([]segment, 0, min(int(n), len(body)))
	for i := uint32(0); i < n && r.err == nil; i++ {
		if r.u32() != 0 || r.byte() != opI32Const {
			return nil, false
		}
		off := r.s32()
		if r.byte() != opEnd {
			return nil, false
		}
		segs = append(segs, segment{uint32(off), r.take(r.u32())})
	}
	if r.err != nil || len(r.b) != 0 {
		return nil, false
	}
	return segs, true
}

// namesData reports whether a custom section is a name section with
// names of data segments (subsection 9), which merging would misplace.
func namesData(body []byte) bool {
	r := &reader{b: body}
	if r.name() != "name" {
		return false
	}
	for r.err == nil && len(r.b) > 0 {
		sub, size := r.byte(), r.u32()
		r.take(size)
		if sub == 9 {
			return true
		}
	}
	return r.err != nil // unreadable: not merged
}

// appendS32 appends v as a signed LEB128 (encoding/binary's Varint is
// zig-zag, another encoding).
func appendS32(dst []byte, v int32) []byte {
	x := int64(v)
	for {
		c := byte(x & 0x7f)
		x >>= 7
		if x == 0 && c&0x40 == 0 || x == -1 && c&0x40 != 0 {
			return append(dst, c)
		}
		dst = append(dst, c|0x80)
	}
}

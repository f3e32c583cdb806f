// Package wasmfile reads what the tests need from a WebAssembly binary
// (its imports, its exported functions, the names of its functions from
// the "name" custom section Go's linker writes, its data segments), and
// merges the data segments of the plugin's build (PackData).
package wasmfile

import (
	"errors"
	"fmt"
)

// Import is one imported function or other external.
type Import struct {
	Module, Name string
	Kind         byte // 0 function, 1 table, 2 memory, 3 global
}

func (i Import) String() string { return i.Module + "." + i.Name }

// Imports returns the module's imports in order.
func Imports(wasm []byte) ([]Import, error) {
	var out []Import
	err := entries(wasm, sectionImport, func(i uint32, r *reader) error {
		imp := Import{Module: r.name(), Name: r.name(), Kind: r.byte()}
		switch imp.Kind {
		case 0: // function: type index
			r.u32()
		case 1: // table: element type, limits
			r.byte()
			r.limits()
		case 2: // memory: limits
			r.limits()
		case 3: // global: value type, mutability
			r.byte()
			r.byte()
		default:
			return fmt.Errorf("import %d: unknown kind %d", i, imp.Kind)
		}
		out = append(out, imp)
		return nil
	})
	return out, err
}

// FunctionExports returns the names the module exports functions under,
// in order: the callbacks a host may call.
func FunctionExports(wasm []byte) ([]string, error) {
	var out []string
	err := entries(wasm, sectionExport, func(_ uint32, r *reader) error {
		name, kind := r.name(), r.byte()
		r.u32() // the index
		if kind == 0 && r.err == nil {
			out = append(out, name)
		}
		return nil
	})
	return out, err
}

// FunctionNames returns the names of the module's functions, imported and
// defined, from the "name" custom section (nil when there is none).
func FunctionNames(wasm []byte) ([]string, error) {
	var out []string
	err := sections(wasm, func(id byte, r *reader) error {
		if id != sectionCustom || r.name() != "name" {
			return nil
		}
		for r.err == nil && len(r.b) > 0 {
			sub, size := r.byte(), r.u32()
			body := r.take(size)
			if sub != 1 || r.err != nil {
				continue
			}
			fr := &reader{b: body}
			n := fr.u32()
			for i := uint32(0); i < n && fr.err == nil; i++ {
				fr.u32() // function index
				out = append(out, fr.name())
			}
			if fr.err != nil {
				return fr.err
			}
		}
		return r.err
	})
	return out, err
}

// entries calls f for each entry of the vector that section id holds,
// with the reader at the entry, until f fails or the section ends.
func entries(wasm []byte, id byte, f func(i uint32, r *reader) error) error {
	return sections(wasm, func(sid byte, r *reader) error {
		if sid != id {
			return nil
		}
		n := r.u32()
		for i := uint32(0); i < n && r.err == nil; i++ {
			if err := f(i, r); err != nil {
				return err
			}
		}
		return r.err
	})
}

// sections calls f with each section's id and contents.
func sections(wasm []byte, f func(id byte, r *reader) error) error {
	if len(wasm) < 8 || string(wasm[:4]) != "\x00asm" {
		return errors.New("wasmfile: not a WebAssembly binary")
	}
	r := &reader{b: wasm[8:]}
	for r.err == nil && len(r.b) > 0 {
		id, size := r.byte(), r.u32()
		body := r.take(size)
		if r.err != nil {
			break
		}
		if err := f(id, &reader{b: body}); err != nil {
			return fmt.Errorf("wasmfile: section %d: %w", id, err)
		}
	}
	if r.err != nil {
		return fmt.Errorf("wasmfile: %w", r.err)
	}
	return nil
}

var errTruncated = errors.New("truncated")

type reader struct {
	b   []byte
	err error
}

func (r *reader) byte() byte {
	if r.err != nil || len(r.b) == 0 {
		r.err = errTruncated
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// u32 reads an unsigned LEB128 of at most 32 bits.
func (r *reader) u32() uint32 { return uint32(r.leb(false)) }

// s32 reads a signed LEB128 of at most 32 bits.
func (r *reader) s32() int32 { return int32(r.leb(true)) }

// leb reads a LEB128 of at most five bytes, sign-extended from its last
// byte when signed.
func (r *reader) leb(signed bool) uint64 {
	var v uint64
	for shift := 0; shift < 35; shift += 7 {
		c := r.byte()
		v |= uint64(c&0x7f) << shift
		if c < 0x80 {
			if signed && c&0x40 != 0 {
				v |= ^uint64(0) << (shift + 7)
			}
			return v
		}
	}
	if r.err == nil {
		r.err = errors.New("integer too long")
	}
	return 0
}

func (r *reader) take(n uint32) []byte {
	if r.err != nil || uint32(len(r.b)) < n {
		r.err = errTruncated
		return nil
	}
	b := r.b[:n]
	r.b = r.b[n:]
	return b
}

func (r *reader) name() string { return string(r.take(r.u32())) }

func (r *reader) limits() {
	if r.byte()&1 != 0 {
		r.u32()
	}
	r.u32()
}

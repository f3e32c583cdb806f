package wasmfile

import (
	"context"
	"slices"
	"testing"

	"github.com/tetratelabs/wazero"
)

// TestFunctionExports: the names of exported functions, in order, and not
// those of other exports.
func TestFunctionExports(t *testing.T) {
	// Two functions of type () -> (), exported as "b" and "a" around the
	// memory's export.
	section := func(dst []byte, id byte, body ...byte) []byte {
		return append(append(dst, id, byte(len(body))), body...)
	}
	m := []byte("\x00asm\x01\x00\x00\x00")
	m = section(m, 1, 1, 0x60, 0, 0) // one type: () -> ()
	m = section(m, 3, 2, 0, 0)       // two functions of it
	m = section(m, 5, 1, 0, 1)       // a memory
	m = section(m, 7, 3, 1, 'b', 0, 1, 1, 'm', 2, 0, 1, 'a', 0, 0)
	m = section(m, 10, 2, 2, 0, 0x0b, 2, 0, 0x0b) // two empty bodies
	if _, err := wazero.NewRuntime(context.Background()).CompileModule(context.Background(), m); err != nil {
		t.Fatalf("the test module is not valid: %v", err)
	}
	got, err := FunctionExports(m)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"b", "a"}; !slices.Equal(got, want) {
		t.Errorf("FunctionExports = %q, want %q", got, want)
	}
	if _, err := FunctionExports(m[:len(m)-8]); err == nil {
		t.Error("a truncated module read without an error")
	}
}

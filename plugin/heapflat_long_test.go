//go:build long && !wasip1

package main

import "testing"

// TestLong_WasmHeapFlat is TestWasm_HeapFlat over two million requests.
func TestLong_WasmHeapFlat(t *testing.T) { heapFlat(t, 2_000_000) }

//go:build long

package store

import (
	"fmt"
	"testing"

	"github.com/sluicehq/sluice/redisbridge/redistest"
)

// TestLong_MemoryEqualsScript is TestStore_MemoryEqualsScript at length:
// 100 seeds of 3,000 steps, one in four with every limit throttled (make
// test-long).
func TestLong_MemoryEqualsScript(t *testing.T) {
	srv := redistest.Start(t)
	for seed := range uint64(100) {
		t.Run(fmt.Sprint("seed ", 1000+seed), func(t *testing.T) {
			compareStores(t, srv, 1000+seed, 3000, seed%4 == 3)
		})
	}
}

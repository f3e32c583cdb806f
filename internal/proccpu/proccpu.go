// Package proccpu reads how much CPU another process used, for benchmarks
// that run the product as processes of their own (a bridge, gateways).
package proccpu

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Of returns the user+system CPU time of process pid from /proc (Linux),
// in clock ticks of 10 ms.
func Of(pid int) (time.Duration, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name, in parentheses, may hold spaces: fields count
	// from after it (state is the first, utime the 12th, stime the 13th).
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 || i+2 > len(raw) {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := bytes.Fields(raw[i+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	ut, err1 := strconv.ParseInt(string(f[11]), 10, 64)
	st, err2 := strconv.ParseInt(string(f[12]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

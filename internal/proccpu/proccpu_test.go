package proccpu

import (
	"os"
	"testing"
	"time"
)

// This process's own CPU time, read as another's, grows with work.
func TestOf(t *testing.T) {
	before, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(50 * time.Millisecond); time.Now().Before(end); {
	}
	after, err := Of(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("CPU time %v, then %v after 50 ms of work", before, after)
	}
	if _, err := Of(-1); err == nil {
		t.Error("no error for a process that does not exist")
	}
}

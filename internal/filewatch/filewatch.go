// Package filewatch tells a process whether the files it serves from
// (configuration, certificates) changed since it last read them, by their
// contents: a process that looks every second rereads a file only when it
// changed, and logs a file it refuses once rather than at every look.
// Contents rather than modification times, which can repeat within their
// resolution; the files are small. Looking by polling rather than with
// inotify also sees a Kubernetes ConfigMap's or Secret's update, which
// swaps a symbolic link to a new directory.
package filewatch

import (
	"bytes"
	"maps"
	"os"
)

// Seen is what the last read of some files found. The zero value has
// seen nothing.
type Seen struct {
	noted bool
	files map[string][]byte
	err   string
}

// Note records what a read found, the files' contents by name or the
// error that stopped it, and reports whether that differs from what the
// previous Note recorded (the first differs).
func (s *Seen) Note(files map[string][]byte, err error) bool {
	msg := ""
	if err != nil {
		msg, files = err.Error(), nil
	}
	if s.noted && msg == s.err && maps.EqualFunc(files, s.files, bytes.Equal) {
		return false
	}
	s.noted, s.files, s.err = true, files, msg
	return true
}

// Read reads the named files, by name; the first that cannot be read
// stops it.
func Read(names ...string) (map[string][]byte, error) {
	files := make(map[string][]byte, len(names))
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		files[n] = b
	}
	return files, nil
}

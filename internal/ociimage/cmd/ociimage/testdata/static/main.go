// A program with no cgo dependency, so Go links it statically however cgo
// is set: a stand-in for the bridge built with CGO_ENABLED=0, which costs a
// rebuild of every dependency.
package main

func main() {}

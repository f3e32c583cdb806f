// Package envoyhosts is the table of what each Envoy's Wasm host provides
// to a plugin (hosts.json, with its source), so that tests can tell which
// Envoy and Istio releases load a module, and that the project's own host
// offers no more than the oldest of them.
package envoyhosts

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

//go:embed hosts.json
var data []byte

// Host is one range of Envoy releases sharing a host library's import set.
type Host struct {
	Envoy        string              `json:"envoy"`         // first release
	EnvoyThrough string              `json:"envoy_through"` // last release; "" for every later one
	Istio        string              `json:"istio"`
	IstioThrough string              `json:"istio_through"`
	CPPHost      []string            `json:"cpp_host"` // proxy-wasm-cpp-host commits
	Imports      map[string][]string `json:"imports"`  // module → function names
}

// Releases names the range, e.g. "Envoy 1.33–1.38 (Istio 1.25–1.30)".
func (h Host) Releases() string {
	return fmt.Sprintf("Envoy %s (Istio %s)", span(h.Envoy, h.EnvoyThrough), span(h.Istio, h.IstioThrough))
}

func span(from, through string) string {
	if through == "" {
		return from + "+"
	}
	return from + "–" + through
}

// Provides reports whether the host has module.name.
func (h Host) Provides(module, name string) bool {
	return slices.Contains(h.Imports[module], name)
}

// Hosts returns the table, oldest host first.
func Hosts() []Host {
	var t struct {
		Hosts []Host `json:"hosts"`
	}
	if err := json.Unmarshal(data, &t); err != nil {
		panic("envoyhosts: hosts.json: " + err.Error()) // embedded data, checked by the tests
	}
	return t.Hosts
}

// Lacking returns, for each of imports (as "module.name") that some host
// does not provide, why: the import and the first (oldest) host lacking it.
func Lacking(imports []string) []string {
	hosts := Hosts()
	var out []string
	for _, imp := range imports {
		mod, name, _ := strings.Cut(imp, ".")
		for _, h := range hosts {
			if !h.Provides(mod, name) {
				out = append(out, fmt.Sprintf("%s is not provided by %s, host library proxy-wasm-cpp-host %v: the module would not load there",
					imp, h.Releases(), h.CPPHost))
				break
			}
		}
	}
	return out
}

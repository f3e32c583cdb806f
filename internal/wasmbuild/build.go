package wasmbuild

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// Build builds the Go package pkg (an import path or a ./relative path
// resolved from the current directory) into the proxy-wasm module out, as
// `make wasm` does:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o out pkg
func Build(pkg, out string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goBin, "build", "-buildmode=c-shared", "-trimpath", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("wasmbuild: building %s: %w\n%s", pkg, err, b)
	}
	return nil
}

package wasmbuild

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	"github.com/sluicehq/sluice/internal/wasmfile"
)

// Build builds the Go package pkg (an import path or a ./relative path
// resolved from the current directory) into the proxy-wasm module out, as
// `make wasm` does:
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -trimpath -o out pkg
//
// then merges the module's data segments (wasmfile.PackData): Go's linker
// writes tens of thousands of them, which every engine keeps and walks for
// each VM it starts.
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
	b, err := os.ReadFile(out)
	if err != nil {
		return fmt.Errorf("wasmbuild: %w", err)
	}
	if b, err = wasmfile.PackData(b, wasmfile.PageGap); err != nil {
		return fmt.Errorf("wasmbuild: packing %s: %w", out, err)
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		return fmt.Errorf("wasmbuild: %w", err)
	}
	return nil
}

package deploycheck

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluicehq/sluice/e2e/e2etest"
	"github.com/sluicehq/sluice/internal/nettest"
	"github.com/sluicehq/sluice/internal/ociimage"
)

const gatewayDir = "../../deploy/kubernetes/gateway"

// gatewayManifests are deploy/kubernetes/gateway, with the namespace and
// Secrets of deploy/kubernetes it is applied with.
func gatewayManifests(t *testing.T) *manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(gatewayDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", gatewayDir, err)
	}
	return oneOfEach(t, append([]string{filepath.Join(kubernetesDir, "00-namespace.yaml"), filepath.Join(kubernetesDir, "10-secrets.yaml")}, files...)...)
}

// gatewayPod is the gateway's container laid out on this machine as the
// kubelet lays it out in its pod: its mounts under a directory, its image's
// plugin, its environment resolved. args are the container's, with each
// path under a mount moved under that directory.
type gatewayPod struct {
	bin  string
	args []string
	env  []string
}

func layOut(t *testing.T, m *manifests, ns string, pod corev1.PodSpec, c corev1.Container, env map[string]string) gatewayPod {
	t.Helper()
	vol := mountVolumes(t, m, ns, pod, c)
	p := gatewayPod{bin: filepath.Join(vol.root, ociimage.GatewayPath)}
	build := exec.Command("go", "build", "-o", p.bin, "github.com/sluicehq/sluice/cmd/gateway")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the gateway: %v\n%s", err, out)
	}
	plugin := filepath.Join(vol.root, ociimage.GatewayPluginPath)
	if err := os.WriteFile(plugin, e2etest.Plugin(t), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, a := range c.Args {
		if name, value, ok := strings.Cut(a, "="); ok {
			a = name + "=" + vol.path(value)
		}
		p.args = append(p.args, a)
	}
	// The image's own environment, then the container's.
	p.env = []string{"SLUICE_GATEWAY_PLUGIN=" + plugin}
	for k, v := range env {
		p.env = append(p.env, k+"="+v)
	}
	return p
}

// podVolumes are a container's volume mounts laid out under root.
type podVolumes struct {
	root   string
	mounts []string // mount paths in the container
}

// mountVolumes lays out c's volume mounts under a directory, as the
// kubelet mounts them: a ConfigMap's keys as files, an emptyDir empty.
func mountVolumes(t *testing.T, m *manifests, ns string, pod corev1.PodSpec, c corev1.Container) podVolumes {
	t.Helper()
	v := podVolumes{root: t.TempDir()}
	volumes := map[string]corev1.Volume{}
	for _, vol := range pod.Volumes {
		volumes[vol.Name] = vol
	}
	for _, vm := range c.VolumeMounts {
		vol, ok := volumes[vm.Name]
		if !ok {
			t.Fatalf("volumeMount %s: no such volume", vm.Name)
		}
		dir := filepath.Join(v.root, vm.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		switch {
		case vol.ConfigMap != nil:
			cm, ok := m.configMaps[ns+"/"+vol.ConfigMap.Name]
			if !ok {
				t.Fatalf("volume %s: ConfigMap %s is not in the manifests", vol.Name, vol.ConfigMap.Name)
			}
			for k, data := range cm.Data {
				if err := os.WriteFile(filepath.Join(dir, k), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		case vol.EmptyDir != nil:
		default:
			t.Fatalf("volume %s: only ConfigMaps and emptyDirs are laid out", vol.Name)
		}
		v.mounts = append(v.mounts, vm.MountPath)
	}
	return v
}

// path is where the container's path p is laid out: under the root when
// it is under a mount, else p.
func (v podVolumes) path(p string) string {
	for _, mp := range v.mounts {
		if strings.HasPrefix(p, mp) {
			return filepath.Join(v.root, p)
		}
	}
	return p
}

// argValue is the value of --name in args (the last one, as flags take it).
func argValue(args []string, name string) string {
	v := ""
	for _, a := range args {
		if n, val, ok := strings.Cut(a, "="); ok && n == "--"+name {
			v = val
		}
	}
	return v
}

func port(t *testing.T, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	if err != nil || n == 0 {
		t.Fatalf("address %q has no port", addr)
	}
	return n
}

// The gateway Deployment, started as the kubelet would start it: the
// gateway accepts its args, environment and the plugin configuration of
// its ConfigMap (--validate); its ports, probes, Service and budget point
// at what it serves.
func TestKubernetes_Gateway(t *testing.T) {
	m := gatewayManifests(t)
	d, c, env := theContainer(t, m)
	pod := d.Spec.Template
	for _, name := range []string{"SLUICE_REDIS_URL", "SLUICE_ADMIN_KEY"} {
		if !fromSecret(c, name) {
			t.Errorf("env %s: take it from a Secret", name)
		}
	}
	if len(c.Command) > 0 {
		t.Errorf("command %v: the image's entrypoint is the gateway; pass flags in args", c.Command)
	}
	if argValue(c.Args, "plugin") != "" {
		t.Errorf("--plugin %s: the image's plugin (SLUICE_GATEWAY_PLUGIN=%s) is the one built with the gateway", argValue(c.Args, "plugin"), ociimage.GatewayPluginPath)
	}
	gw := layOut(t, m, d.Namespace, pod.Spec, c, env)

	// As the kubelet would start it, checked and not served.
	validate := exec.Command(gw.bin, append(gw.args, "--validate")...)
	validate.Env = gw.env
	if out, err := validate.CombinedOutput(); err != nil || !bytes.Contains(out, []byte("configuration valid")) {
		t.Fatalf("the gateway refuses its Deployment: %v\n%s", err, out)
	}

	listen, admin := port(t, argValue(c.Args, "listen")), port(t, argValue(c.Args, "admin-listen"))
	ports := map[int]bool{}
	for _, p := range c.Ports {
		ports[int(p.ContainerPort)] = true
	}
	for _, want := range []struct {
		port  int
		image string
	}{{listen, ociimage.GatewayPort}, {admin, ociimage.GatewayAdminPort}} {
		if !ports[want.port] {
			t.Errorf("container ports %+v lack %d, where the gateway listens", c.Ports, want.port)
		}
		if fmt.Sprintf("%d/tcp", want.port) != want.image {
			t.Errorf("the gateway listens on %d, its image exposes %s", want.port, want.image)
		}
	}
	if sc := pod.Spec.SecurityContext; sc == nil || sc.RunAsUser == nil || sc.RunAsGroup == nil ||
		fmt.Sprintf("%d:%d", *sc.RunAsUser, *sc.RunAsGroup) != ociimage.BridgeUser {
		t.Errorf("pod securityContext %+v: want runAsUser:runAsGroup %s, the gateway image's user", sc, ociimage.BridgeUser)
	}
	grace := 10 * time.Second // the gateway's --shutdown-grace default
	if g := argValue(c.Args, "shutdown-grace"); g != "" {
		grace, _ = time.ParseDuration(g)
	}
	if tg := pod.Spec.TerminationGracePeriodSeconds; tg == nil || float64(*tg) <= grace.Seconds() {
		t.Errorf("terminationGracePeriodSeconds %v: want more than --shutdown-grace %v", tg, grace)
	}

	// The probes, against the gateway serving as deployed, on free ports
	// and its memory store (the routes do not depend on the store).
	addrs := nettest.FreeAddrs(t, 2)
	httpAddr, adminAddr := addrs[0], addrs[1]
	serve := exec.Command(gw.bin, append(gw.args, "--listen="+httpAddr, "--admin-listen="+adminAddr)...)
	serve.Env = append(gw.env, "SLUICE_STORE=memory", "SLUICE_REDIS_URL=")
	var logs bytes.Buffer
	serve.Stdout, serve.Stderr = &logs, &logs
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { serve.Process.Kill(); serve.Wait() }()
	get := func(path string) int {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+adminAddr+path, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	for end := time.Now().Add(60 * time.Second); get("/ready") != http.StatusOK; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the gateway did not become ready:\n%s", logs.String())
		}
	}
	if get("/no-such-probe") != http.StatusNotFound {
		t.Fatal("the admin address answers any path: the probe checks below could not fail")
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
	}{{"readinessProbe", c.ReadinessProbe}, {"livenessProbe", c.LivenessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe", p.name)
			continue
		}
		g := p.probe.HTTPGet
		if code := get(g.Path); code != http.StatusOK {
			t.Errorf("%s path %q: the gateway's admin address answers %d", p.name, g.Path, code)
		}
		if pt := resolvePort(c, g.Port); pt != admin {
			t.Errorf("%s port %s is %d, the admin address is on %d", p.name, g.Port.String(), pt, admin)
		}
	}

	svc, pdb := m.services[0], m.pdbs[0]
	if !subset(svc.Spec.Selector, pod.Labels) || len(svc.Spec.Ports) != 1 {
		t.Fatalf("Service %s: selector %v, ports %+v: want the gateway's pods and one port", svc.Name, svc.Spec.Selector, svc.Spec.Ports)
	}
	if pt := resolvePort(c, svc.Spec.Ports[0].TargetPort); pt != listen {
		t.Errorf("Service targets port %d, the gateway listens on %d (its admin address stays off the Service)", pt, listen)
	}
	if pdb.Spec.Selector == nil || !subset(pdb.Spec.Selector.MatchLabels, pod.Labels) {
		t.Errorf("PodDisruptionBudget selector %v does not select the gateway's pods", pdb.Spec.Selector)
	}
	r := c.Resources
	if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Memory().Cmp(*r.Requests.Memory()) < 0 {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit above its request", r)
	}
}

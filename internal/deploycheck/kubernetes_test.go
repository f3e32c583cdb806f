package deploycheck

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/sluicehq/sluice/internal/ociimage"
	"github.com/sluicehq/sluice/redisbridge"
)

const kubernetesDir = "../../deploy/kubernetes"

// manifests are the decoded objects of deploy/kubernetes.
type manifests struct {
	namespaces  map[string]*corev1.Namespace
	secrets     map[string]*corev1.Secret    // by namespace/name
	configMaps  map[string]*corev1.ConfigMap // by namespace/name
	services    []*corev1.Service
	deployments []*appsv1.Deployment
	pdbs        []*policyv1.PodDisruptionBudget
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// decodeManifests decodes every document of the files into the Kubernetes
// API type its apiVersion and kind name, refusing unknown fields, as the
// API server's strict field validation does.
func decodeManifests(files ...string) (*manifests, error) {
	m := &manifests{namespaces: map[string]*corev1.Namespace{}, secrets: map[string]*corev1.Secret{}, configMaps: map[string]*corev1.ConfigMap{}}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		for i, doc := range docSeparator.Split(string(b), -1) {
			js, err := yaml.YAMLToJSON([]byte(doc))
			if err != nil {
				return nil, fmt.Errorf("%s document %d: %w", f, i+1, err)
			}
			if string(js) == "null" {
				continue // comments only
			}
			var tm metav1.TypeMeta
			if err := json.Unmarshal(js, &tm); err != nil {
				return nil, fmt.Errorf("%s document %d: %w", f, i+1, err)
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "v1 Namespace":
				obj = &corev1.Namespace{}
			case "v1 Secret":
				obj = &corev1.Secret{}
			case "v1 ConfigMap":
				obj = &corev1.ConfigMap{}
			case "v1 Service":
				obj = &corev1.Service{}
			case "apps/v1 Deployment":
				obj = &appsv1.Deployment{}
			case "policy/v1 PodDisruptionBudget":
				obj = &policyv1.PodDisruptionBudget{}
			default:
				// deploy/istio holds Istio's own kinds; they are checked by
				// internal/envoycheck.
				if strings.Contains(tm.APIVersion, "istio.io") {
					continue
				}
				return nil, fmt.Errorf("%s document %d: %s %s is not a kind these checks know", f, i+1, tm.APIVersion, tm.Kind)
			}
			dec := json.NewDecoder(bytes.NewReader(js))
			dec.DisallowUnknownFields()
			if err := dec.Decode(obj); err != nil {
				return nil, fmt.Errorf("%s document %d (%s): %w", f, i+1, tm.Kind, err)
			}
			switch o := obj.(type) {
			case *corev1.Namespace:
				m.namespaces[o.Name] = o
			case *corev1.Secret:
				m.secrets[o.Namespace+"/"+o.Name] = o
			case *corev1.ConfigMap:
				m.configMaps[o.Namespace+"/"+o.Name] = o
			case *corev1.Service:
				m.services = append(m.services, o)
			case *appsv1.Deployment:
				m.deployments = append(m.deployments, o)
			case *policyv1.PodDisruptionBudget:
				m.pdbs = append(m.pdbs, o)
			}
		}
	}
	return m, nil
}

func kubernetesManifests(t *testing.T) *manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(kubernetesDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", kubernetesDir, err)
	}
	return oneOfEach(t, files...)
}

// oneOfEach decodes files, which must hold one Deployment, one Service
// and one PodDisruptionBudget.
func oneOfEach(t *testing.T, files ...string) *manifests {
	t.Helper()
	m, err := decodeManifests(files...)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.deployments) != 1 || len(m.services) != 1 || len(m.pdbs) != 1 {
		t.Fatalf("want one Deployment, Service and PodDisruptionBudget, got %d, %d, %d", len(m.deployments), len(m.services), len(m.pdbs))
	}
	return m
}

// theContainer is the one container of m's Deployment, with the
// environment the kubelet would give it; a namespace, Secret or key the
// manifests lack is an error of t.
func theContainer(t *testing.T, m *manifests) (d *appsv1.Deployment, c corev1.Container, env map[string]string) {
	t.Helper()
	d = m.deployments[0]
	if _, ok := m.namespaces[d.Namespace]; !ok {
		t.Errorf("Deployment namespace %q is not created by the manifests", d.Namespace)
	}
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("want one container, got %d", n)
	}
	c = d.Spec.Template.Spec.Containers[0]
	env, problems := containerEnv(m, d.Namespace, c)
	for _, p := range problems {
		t.Error(p)
	}
	return d, c, env
}

// bridgeEnv is every environment variable the bridge reads: SLUICE_ and
// its flag names (ParseSettings), the flags as Usage lists them.
func bridgeEnv(t *testing.T) map[string]bool {
	t.Helper()
	var b bytes.Buffer
	redisbridge.Usage(&b)
	env := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`).FindAllStringSubmatch(b.String(), -1) {
		env["SLUICE_"+strings.ToUpper(strings.ReplaceAll(m[1], "-", "_"))] = true
	}
	if !env["SLUICE_REDIS_URL"] || !env["SLUICE_LISTEN"] {
		t.Fatalf("no flags found in the bridge's usage:\n%s", b.String())
	}
	return env
}

// containerEnv resolves the container's environment as the kubelet does,
// from literal values and keys of Secrets that the manifests define.
func containerEnv(m *manifests, ns string, c corev1.Container) (map[string]string, []string) {
	env := map[string]string{}
	var problems []string
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			ref := e.ValueFrom.SecretKeyRef
			s, ok := m.secrets[ns+"/"+ref.Name]
			if !ok {
				problems = append(problems, fmt.Sprintf("env %s: Secret %s/%s is not in the manifests", e.Name, ns, ref.Name))
				continue
			}
			if v, ok := s.StringData[ref.Key]; ok {
				env[e.Name] = v
			} else if v, ok := s.Data[ref.Key]; ok {
				env[e.Name] = string(v)
			} else {
				problems = append(problems, fmt.Sprintf("env %s: Secret %s/%s has no key %q", e.Name, ns, ref.Name, ref.Key))
			}
		default:
			problems = append(problems, fmt.Sprintf("env %s: only values and secretKeyRef are checked", e.Name))
		}
	}
	if len(c.EnvFrom) > 0 {
		problems = append(problems, "envFrom: name each variable, so the checks can see it")
	}
	return env, problems
}

// The bridge Deployment, read as the bridge would read it: its settings
// parse, every variable is one the bridge reads, every Secret it takes
// exists, and the probes and ports point at what the bridge serves.
func TestKubernetes_Bridge(t *testing.T) {
	m := kubernetesManifests(t)
	d, c, env := theContainer(t, m)
	pod := d.Spec.Template
	known := bridgeEnv(t)
	for name := range env {
		if !known[name] {
			t.Errorf("env %s: the bridge reads no such variable (it reads %v)", name, sortedKeys(known))
		}
	}
	if len(c.Command) > 0 {
		t.Errorf("command %v: the image's entrypoint is the bridge; pass flags in args", c.Command)
	}
	set, err := redisbridge.ParseSettings(c.Args, func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("the bridge refuses args %v with this environment: %v", c.Args, err)
	}
	// What the bridge relies on in production.
	if set.Store != "redis" || set.AdminKey == "" || set.CheckToken == "" {
		t.Errorf("store %q, admin key set %v, check token set %v: want redis and both credentials", set.Store, set.AdminKey != "", set.CheckToken != "")
	}
	for _, name := range []string{"SLUICE_REDIS_URL", "SLUICE_ADMIN_KEY", "SLUICE_CHECK_TOKEN"} {
		if !fromSecret(c, name) {
			t.Errorf("env %s: take it from a Secret", name)
		}
	}

	_, portStr, err := net.SplitHostPort(set.Listen)
	if err != nil {
		t.Fatalf("--listen %q: %v", set.Listen, err)
	}
	listen, _ := strconv.Atoi(portStr)
	if len(c.Ports) != 1 || c.Ports[0].ContainerPort != int32(listen) {
		t.Errorf("container ports %+v: want the one the bridge listens on, %d", c.Ports, listen)
	}
	// The image `make oci` builds (internal/ociimage) runs as this user and
	// exposes this port.
	if sc := pod.Spec.SecurityContext; sc == nil || sc.RunAsUser == nil || sc.RunAsGroup == nil ||
		fmt.Sprintf("%d:%d", *sc.RunAsUser, *sc.RunAsGroup) != ociimage.BridgeUser {
		t.Errorf("pod securityContext %+v: want runAsUser:runAsGroup %s, the bridge image's user", sc, ociimage.BridgeUser)
	}
	if want := fmt.Sprintf("%d/tcp", listen); want != ociimage.BridgePort {
		t.Errorf("the bridge listens on %s, its image exposes %s", want, ociimage.BridgePort)
	}
	if grace := pod.Spec.TerminationGracePeriodSeconds; grace == nil || float64(*grace) <= set.ShutdownGrace.Seconds() {
		t.Errorf("terminationGracePeriodSeconds %v: want more than --shutdown-grace %v, or the kubelet kills checks in flight", grace, set.ShutdownGrace)
	}

	// Envoy's rate limit service: the ConfigMap's file, where the pod
	// mounts it, is a configuration the bridge loads (New below).
	if set.RLSConfig == "" {
		t.Error("SLUICE_RLS_CONFIG: unset, so the bridge serves no rate limit service for deploy/istio/envoy-ratelimit")
	}
	set.RLSConfig = mountVolumes(t, m, d.Namespace, pod.Spec, c).path(set.RLSConfig)
	// The probes, against the bridge's real routes. The store does not
	// change the routes; memory answers /readyz without a Redis.
	set.Store, set.RedisURL = "memory", ""
	set.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	set.AuditLog = filepath.Join(t.TempDir(), "audit.log")
	br, err := redisbridge.New(set)
	if err != nil {
		t.Fatal(err)
	}
	defer br.Close()
	srv := httptest.NewServer(br.Handler())
	defer srv.Close()
	served := func(path string) int {
		res, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if served("/no-such-probe") != http.StatusNotFound {
		t.Fatal("the bridge answers any path: the probe checks below could not fail")
	}
	for _, p := range []struct {
		name, want string
		probe      *corev1.Probe
	}{{"readinessProbe", "/readyz", c.ReadinessProbe}, {"livenessProbe", "/healthz", c.LivenessProbe}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: want an httpGet probe on %s", p.name, p.want)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.want {
			t.Errorf("%s path %q: want %s", p.name, g.Path, p.want)
		}
		if code := served(g.Path); code != http.StatusOK {
			t.Errorf("%s path %q: the bridge answers %d", p.name, g.Path, code)
		}
		if port := resolvePort(c, g.Port); port != listen {
			t.Errorf("%s port %s is %d, the bridge listens on %d", p.name, g.Port.String(), port, listen)
		}
		if g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP {
			t.Errorf("%s scheme %s: the bridge serves cleartext without --tls-cert", p.name, g.Scheme)
		}
	}

	r := c.Resources
	if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: want cpu and memory requests and a memory limit", r)
	}
	if r.Limits.Memory().Cmp(*r.Requests.Memory()) < 0 {
		t.Errorf("memory limit %v below its request %v", r.Limits.Memory(), r.Requests.Memory())
	}
	if c.Image == "" {
		t.Error("no image")
	}
}

func fromSecret(c corev1.Container, name string) bool {
	for _, e := range c.Env {
		if e.Name == name {
			return e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil
		}
	}
	return false
}

// resolvePort is the container port a probe or Service port names, or -1.
func resolvePort(c corev1.Container, p intstr.IntOrString) int {
	if p.Type == intstr.Int {
		return p.IntValue()
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort)
		}
	}
	return -1
}

// The Service and the PodDisruptionBudget select the bridge's pods, the
// Service reaches its port, and the budget lets a drain proceed.
func TestKubernetes_ServiceAndBudget(t *testing.T) {
	m := kubernetesManifests(t)
	d, svc, pdb := m.deployments[0], m.services[0], m.pdbs[0]
	podLabels := d.Spec.Template.Labels
	sel, err := metav1.LabelSelectorAsMap(d.Spec.Selector)
	if err != nil || !subset(sel, podLabels) {
		t.Errorf("Deployment selector %v does not select its pods %v (%v)", sel, podLabels, err)
	}
	if len(svc.Spec.Selector) == 0 || !subset(svc.Spec.Selector, podLabels) {
		t.Errorf("Service selector %v does not select the bridge pods %v", svc.Spec.Selector, podLabels)
	}
	c := d.Spec.Template.Spec.Containers[0]
	for _, p := range svc.Spec.Ports {
		if resolvePort(c, p.TargetPort) != int(c.Ports[0].ContainerPort) {
			t.Errorf("Service port %s targets %s, not the bridge's port %d", p.Name, p.TargetPort.String(), c.Ports[0].ContainerPort)
		}
	}
	psel, err := metav1.LabelSelectorAsMap(pdb.Spec.Selector)
	if err != nil || len(psel) == 0 || !subset(psel, podLabels) {
		t.Errorf("PodDisruptionBudget selector %v does not select the bridge pods %v (%v)", psel, podLabels, err)
	}
	replicas := int32(1)
	if d.Spec.Replicas != nil {
		replicas = *d.Spec.Replicas
	}
	switch {
	case replicas < 2:
		t.Errorf("replicas %d: run two or more bridges", replicas)
	case pdb.Spec.MaxUnavailable != nil:
		if n := pdb.Spec.MaxUnavailable.IntValue(); pdb.Spec.MaxUnavailable.Type != intstr.Int || n < 1 || n >= int(replicas) {
			t.Errorf("maxUnavailable %s: want a count from 1 to replicas-1", pdb.Spec.MaxUnavailable.String())
		}
	case pdb.Spec.MinAvailable != nil:
		if n := pdb.Spec.MinAvailable.IntValue(); pdb.Spec.MinAvailable.Type != intstr.Int || n < 1 || n >= int(replicas) {
			t.Errorf("minAvailable %s: want a count from 1 to replicas-1, or no drain can proceed", pdb.Spec.MinAvailable.String())
		}
	default:
		t.Error("PodDisruptionBudget sets neither maxUnavailable nor minAvailable")
	}
	for _, o := range []metav1.ObjectMeta{d.ObjectMeta, svc.ObjectMeta, pdb.ObjectMeta} {
		if o.Namespace != d.Namespace {
			t.Errorf("%s in namespace %q, the bridge in %q", o.Name, o.Namespace, d.Namespace)
		}
	}
}

// deploy/istio/bridge.yaml declares the same Service for the Istio gateway
// (with its DestinationRule); the two must not disagree, or whichever is
// applied last wins.
func TestKubernetes_ServiceMatchesIstio(t *testing.T) {
	m := kubernetesManifests(t)
	istio, err := decodeManifests("../../deploy/istio/bridge.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(istio.services) != 1 {
		t.Fatalf("deploy/istio/bridge.yaml: want one Service, got %d", len(istio.services))
	}
	a, b := m.services[0], istio.services[0]
	if a.Name != b.Name || a.Namespace != b.Namespace || !reflect.DeepEqual(a.Spec, b.Spec) {
		t.Errorf("Services differ:\n deploy/kubernetes: %s/%s %+v\n deploy/istio:      %s/%s %+v", a.Namespace, a.Name, a.Spec, b.Namespace, b.Name, b.Spec)
	}
}

// A misspelled field, an unknown kind and a Secret key that does not exist
// are each refused.
func TestDecodeManifests_Refuses(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct{ body, want string }{
		{"apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selectr: {app: x}}\n", `unknown field "selectr"`},
		{"apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: x}\n", "not a kind these checks know"},
		{"apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {url: 5\n", "document 1"},
	} {
		_, err := decodeManifests(write("m.yaml", tc.body))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err %v, want %q", tc.body, err, tc.want)
		}
	}
	m, err := decodeManifests(write("s.yaml", "apiVersion: v1\nkind: Secret\nmetadata: {name: s, namespace: ns1}\nstringData: {url: x}\n"))
	if err != nil {
		t.Fatal(err)
	}
	_, problems := containerEnv(m, "ns1", corev1.Container{Env: []corev1.EnvVar{
		{Name: "A", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "uri"}}},
		{Name: "B", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "t"}, Key: "url"}}},
	}})
	if got := strings.Join(problems, "\n"); !strings.Contains(got, `has no key "uri"`) || !strings.Contains(got, "Secret ns1/t is not in the manifests") {
		t.Errorf("problems %v", problems)
	}
}

func subset(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// Package deploycheck checks what operators deploy against the product it
// deploys. Its tests, run by `go test ./internal/deploycheck/`, cover:
//
//   - deploy/grafana/sluice.json and deploy/prometheus/alerts.yaml: every
//     PromQL expression parses with Prometheus's own parser, and every
//     metric and label it names is one a running bridge serves on /metrics
//     or one the built plugin defines, under the name Envoy and Istio give
//     it; promtool checks the rules and fires each alert in
//     alerts_test.yaml;
//   - deploy/kubernetes: every document decodes into the Kubernetes API
//     types, and what the bridge relies on (its flags, environment,
//     secrets, probe paths and ports) agrees with the bridge's code;
//   - deploy/kubernetes/gateway: the gateway, built and laid out as its
//     pod, accepts its Deployment (--validate) and serves its probes.
//
// The package has no code outside its tests.
package deploycheck

package tests

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"text/template"

	"gopkg.in/yaml.v3"
)

// helmChartDir is the fabric's Helm chart.
const helmChartDir = "deploy/helm/fabric"

// chartFiles is the .Files of a chart: Get reads a file of the chart.
type chartFiles struct{ dir string }

func (f chartFiles) Get(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(f.dir, filepath.FromSlash(name)))
	return string(b), err
}

// chartFuncs are the few Helm template functions the chart uses, with
// Helm's meaning. The chart keeps to them so that this test renders it
// without Helm (Debian has no helm package); `helm template
// deploy/helm/fabric` renders the same manifests.
var chartFuncs = template.FuncMap{
	"indent": func(n int, s string) string {
		pad := strings.Repeat(" ", n)
		return pad + strings.ReplaceAll(s, "\n", "\n"+pad)
	},
	"list": func(v ...any) []any { return v },
}

// renderChart renders the chart's templates with values.yaml overridden by
// set (top-level keys), as `helm template` would, and returns the manifests
// and the files it read.
func renderChart(t *testing.T, set map[string]any) (string, []string) {
	t.Helper()
	dir := filepath.Join(repoRoot(t), helmChartDir)
	var chart struct {
		APIVersion string `yaml:"apiVersion"`
		Name       string `yaml:"name"`
		Version    string `yaml:"version"`
	}
	if err := yaml.Unmarshal(readDeployFile(t, helmChartDir+"/Chart.yaml"), &chart); err != nil {
		t.Fatalf("Chart.yaml: %v", err)
	}
	if chart.APIVersion != "v2" || chart.Name != "fabric" || chart.Version == "" {
		t.Fatalf("Chart.yaml: apiVersion %q name %q version %q", chart.APIVersion, chart.Name, chart.Version)
	}
	values := map[string]any{}
	if err := yaml.Unmarshal(readDeployFile(t, helmChartDir+"/values.yaml"), &values); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	for k, v := range set {
		values[k] = v
	}
	files := []string{helmChartDir + "/Chart.yaml", helmChartDir + "/values.yaml"}
	names, err := filepath.Glob(filepath.Join(dir, "templates", "*.yaml"))
	if err != nil || len(names) == 0 {
		t.Fatalf("no templates in %s: %v", helmChartDir, err)
	}
	slices.Sort(names)
	data := map[string]any{
		"Values":  values,
		"Release": map[string]any{"Name": "fabric", "Namespace": "default"},
		"Chart":   map[string]any{"Name": chart.Name, "Version": chart.Version},
		"Files":   chartFiles{dir},
	}
	var out bytes.Buffer
	for _, name := range names {
		rel := helmChartDir + "/templates/" + filepath.Base(name)
		files = append(files, rel)
		raw, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		tpl, err := template.New(rel).Option("missingkey=error").Funcs(chartFuncs).Parse(string(raw))
		if err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		fmt.Fprintf(&out, "---\n# Source: %s\n", rel)
		if err := tpl.Execute(&out, data); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		out.WriteByte('\n')
	}
	return out.String(), append(files, helmChartDir+"/files/accounts.conf")
}

// TestHelmChartRenders renders the chart and checks what it makes: valid
// manifests, the NATS users of deploy/nats/accounts.conf unchanged, the
// node configuration of deploy/kubernetes/nats.yaml, and values that reach
// the manifests. The role commands are checked against compose by
// TestDeployFilesAgree.
func TestHelmChartRenders(t *testing.T) {
	t.Parallel()
	if got, want := readDeployFile(t, helmChartDir+"/files/accounts.conf"), readDeployFile(t, "deploy/nats/accounts.conf"); !bytes.Equal(got, want) {
		t.Errorf("%s/files/accounts.conf differs from deploy/nats/accounts.conf; copy it", helmChartDir)
	}
	manifests, _ := renderChart(t, map[string]any{"natsStorage": "7Gi", "maxBatch": 5000})
	docs := kubeDocs(t, helmChartDir, strings.NewReader(manifests))
	var kinds []string
	var natsConf, accounts string
	for _, d := range docs {
		kinds = append(kinds, d.Kind+"/"+d.Metadata.Name)
		if d.Kind == "ConfigMap" && d.Metadata.Name == "fabric-nats" {
			natsConf, accounts = d.Data["nats.conf"], d.Data["accounts.conf"]
		}
	}
	slices.Sort(kinds)
	want := []string{
		"ConfigMap/fabric-nats", "Deployment/fabric-api", "Deployment/fabric-converge", "Deployment/fabric-fanout",
		"Deployment/fabric-ingest", "Ingress/fabric", "Job/fabric-provision", "Service/fabric-api", "Service/fabric-fanout",
		"Service/fabric-ingest", "Service/fabric-nats", "StatefulSet/fabric-nats",
	}
	if !slices.Equal(kinds, want) {
		t.Errorf("the chart renders %v, want %v", kinds, want)
	}
	if accounts != string(readDeployFile(t, "deploy/nats/accounts.conf")) {
		t.Errorf("the chart's accounts.conf is not deploy/nats/accounts.conf:\n%s", accounts)
	}
	if !strings.Contains(manifests, "storage: 7Gi") || !strings.Contains(manifests, "-max-batch=5000") || !strings.Contains(natsConf, "max_msgs: 5000") {
		t.Errorf("values natsStorage and maxBatch do not reach the manifests")
	}
	// The Ingress's host and TLS come from values, and it can be left out.
	values := map[string]any{}
	if err := yaml.Unmarshal(readDeployFile(t, helmChartDir+"/values.yaml"), &values); err != nil {
		t.Fatal(err)
	}
	ing := values["ingress"].(map[string]any)
	ing["host"], ing["tlsSecret"] = "fabric.example.com", "fabric-tls"
	withHost, _ := renderChart(t, map[string]any{"ingress": ing})
	hostDocs := kubeDocs(t, helmChartDir, strings.NewReader(withHost))
	if in := readIngress(t, helmChartDir, hostDocs); len(in.Rules) != 7 || !strings.Contains(withHost, "host: fabric.example.com\n") ||
		!strings.Contains(withHost, "secretName: fabric-tls") {
		t.Errorf("ingress.host and ingress.tlsSecret do not reach the Ingress:\n%s", withHost)
	}
	ing["enabled"] = false
	without, _ := renderChart(t, map[string]any{"ingress": ing})
	for _, d := range kubeDocs(t, helmChartDir, strings.NewReader(without)) {
		if d.Kind == "Ingress" {
			t.Error("ingress.enabled=false renders an Ingress")
		}
	}
	natsConf = strings.ReplaceAll(natsConf, "max_msgs: 5000", "max_msgs: 10000")
	if got, want := natsNodeShape(natsConf), natsNodeShape(kubeNATSConf(t)); got != want {
		t.Errorf("the chart's nats.conf differs from %s:\n%s\nwant\n%s", kubeNATSFile, got, want)
	}
}

// kubeNATSConf is the node configuration of deploy/kubernetes/nats.yaml.
func kubeNATSConf(t *testing.T) string {
	t.Helper()
	for _, d := range kubeDocs(t, kubeNATSFile, bytes.NewReader(readDeployFile(t, kubeNATSFile))) {
		if d.Kind == "ConfigMap" && d.Metadata.Name == "fabric-nats" {
			return d.Data["nats.conf"]
		}
	}
	t.Fatalf("%s has no ConfigMap fabric-nats", kubeNATSFile)
	return ""
}

// natsNodeShape is a node configuration without comments, blank lines,
// indentation, its server name and its routes' host names: what every node
// of every deploy shares.
func natsNodeShape(conf string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(conf, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.Index(line, "#"); i >= 0 && !strings.Contains(line, "\"") {
			line = strings.TrimSpace(line[:i])
		}
		switch {
		case line == "":
			continue
		case strings.HasPrefix(line, "server_name:"):
			line = "server_name: <node>"
		case strings.HasPrefix(line, "nats-route://"):
			line = "nats-route://<node>:6222"
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// TestKubernetesNATSIsTheNodeConfiguration checks that the Kubernetes node
// configuration is deploy/nats/nats-1.conf apart from names.
func TestKubernetesNATSIsTheNodeConfiguration(t *testing.T) {
	t.Parallel()
	want := natsNodeShape(string(readDeployFile(t, "deploy/nats/nats-1.conf")))
	for i := 2; i <= 3; i++ {
		if got := natsNodeShape(string(readDeployFile(t, fmt.Sprintf("deploy/nats/nats-%d.conf", i)))); got != want {
			t.Errorf("deploy/nats/nats-%d.conf differs from nats-1.conf beyond its name:\n%s", i, got)
		}
	}
	if got := natsNodeShape(kubeNATSConf(t)); got != want {
		t.Errorf("%s's nats.conf differs from deploy/nats/nats-1.conf:\n%s\nwant\n%s", kubeNATSFile, got, want)
	}
}

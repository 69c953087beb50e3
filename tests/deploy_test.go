package tests

import (
	"fmt"
	"maps"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"
)

// TestDeployFilesAgree reads the role commands of compose, the Kubernetes
// manifests and the Helm chart, checks that they run every role with the
// same flags, user and secrets, and that each role accepts every flag it is
// given; and that their Ingress sends each route to the role serving it.
func TestDeployFilesAgree(t *testing.T) {
	t.Parallel()
	t.Run("ingress routes", checkIngressRoutes)
	roles, files := deployRoles(t)
	t.Logf("deploy files: %s", strings.Join(files, ", "))
	bin := binaries(t)
	for _, role := range slices.Sorted(maps.Keys(roles)) {
		c := roles[role]
		key := strings.Join(append([]string{c.binary()}, c.subcommand()...), " ")
		out, _ := exec.Command(filepath.Join(bin, c.binary()), append(c.subcommand(), "-h")...).CombinedOutput()
		for name := range c.settings {
			if !strings.Contains(string(out), "  -"+name+" ") && !strings.Contains(string(out), "  -"+name+"\n") {
				t.Errorf("%s: %s has no flag -%s", c.where, key, name)
			}
		}
		if c.settings["replicas"] != "3" {
			t.Errorf("%s: -replicas=%q; the deploy's streams have 3 replicas", c.where, c.settings["replicas"])
		}
		if c.binary() == "converge" && c.settings["max-batch"] != strconv.Itoa(deployMaxBatch) {
			t.Errorf("%s: converge without -max-batch=%d, the NATS servers' batch limit", c.where, deployMaxBatch)
		}
		// ingest opens the group event keys converge seals under the
		// master key, with or without the client API.
		if (c.binary() == "ingest" || c.binary() == "converge") && c.secrets["FABRIC_MASTER_KEY"] != "FABRIC_MASTER_KEY" {
			t.Errorf("%s: %s without FABRIC_MASTER_KEY from the deploy's secrets", c.where, key)
		}
		if c.settings["nats-user"] == "" || c.secrets["FABRIC_NATS_PASSWORD"] != "FABRIC_"+strings.ToUpper(c.settings["nats-user"])+"_PASSWORD" {
			t.Errorf("%s: NATS user %q with password from %q", c.where, c.settings["nats-user"], c.secrets["FABRIC_NATS_PASSWORD"])
		}
		for _, u := range strings.Split(c.settings["nats-url"], ",") {
			if !strings.HasPrefix(u, "tls://") || strings.Contains(u, "@") {
				t.Errorf("%s: NATS URL %q; the deploy connects with tls:// and no credentials in the URL", c.where, u)
			}
		}
	}
}

// deployMaxBatch is the atomic batch limit of deploy/'s NATS servers and
// the -max-batch of its converge workers.
const deployMaxBatch = 10000

// TestNATSConfigsLoad parses each node's configuration the way nats-server
// does, with the passwords the environment would give and the test's
// certificates, and checks what protects the cluster: TLS for clients and
// routes, route authorization by certificate, monitoring on loopback.
func TestNATSConfigsLoad(t *testing.T) {
	c := writeDeployNATS(t, t.TempDir(), "")
	for i, n := range c.nodes {
		path := fmt.Sprintf("deploy/nats/nats-%d.conf", i+1)
		opts, err := server.ProcessConfigFile(n.conf)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if !opts.JetStream || opts.Cluster.Name != "fabric" || len(opts.Routes) != 3 || !opts.SyncAlways {
			t.Errorf("%s: jetstream %v cluster %q routes %d sync always %v", path, opts.JetStream, opts.Cluster.Name, len(opts.Routes), opts.SyncAlways)
		}
		// converge's -max-batch in compose and kubernetes is this limit.
		if got := opts.JetStreamLimits.MaxBatchSize; got != deployMaxBatch {
			t.Errorf("%s: atomic batch limit %d, want %d as converge's -max-batch", path, got, deployMaxBatch)
		}
		if opts.HTTPHost != "127.0.0.1" || opts.HTTPSPort != 0 {
			t.Errorf("%s: monitoring on %q (https port %d); it has no authentication and must stay on loopback", path, opts.HTTPHost, opts.HTTPSPort)
		}
		if opts.TLSConfig == nil {
			t.Errorf("%s: clients connect without TLS", path)
		}
		if opts.Cluster.TLSConfig == nil || !opts.Cluster.TLSMap || opts.Cluster.Username != routeIdentity {
			t.Errorf("%s: routes without mutual TLS mapped to %s (map %v, user %q)", path, routeIdentity, opts.Cluster.TLSMap, opts.Cluster.Username)
		}
		if opts.NoAuthUser != "" {
			t.Errorf("%s: no_auth_user %q lets a client in without credentials", path, opts.NoAuthUser)
		}
		users := map[string]*server.User{}
		for _, u := range opts.Users {
			users[u.Username] = u
		}
		for _, name := range natsUsers {
			if users[name] == nil {
				t.Errorf("%s: no user %s", path, name)
			}
		}
		for name, u := range users {
			if u.Permissions == nil || u.Permissions.Publish == nil || u.Permissions.Subscribe == nil {
				if name != "sys" {
					t.Errorf("%s: user %s has no publish and subscribe permissions", path, name)
				}
				continue
			}
			for _, subj := range append(slices.Clone(u.Permissions.Publish.Allow), u.Permissions.Subscribe.Allow...) {
				if subj == ">" || strings.HasPrefix(subj, "$JS.API.>") || subj == "_INBOX.>" || subj == "$JS.API.STREAM.>" {
					t.Errorf("%s: user %s may use %s", path, name, subj)
				}
			}
		}
	}
}

// TestAlertRules checks deploy/prometheus/alerts.yml with promtool.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	promtool(t, nil, "check", "rules", filepath.Join(repoRoot(t), "deploy/prometheus/alerts.yml"))
}

// TestPrometheusScrapesEveryProcess checks that deploy/prometheus scrapes
// every process compose runs: each role on its default -listen port and the
// NATS exporter beside each server.
func TestPrometheusScrapesEveryProcess(t *testing.T) {
	t.Parallel()
	var prom struct {
		ScrapeConfigs []struct {
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	if err := yaml.Unmarshal(readDeployFile(t, "deploy/prometheus/prometheus.yml"), &prom); err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, sc := range prom.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, tg := range st.Targets {
				targets[tg] = true
			}
		}
	}
	var compose struct {
		Services map[string]struct {
			Command     []string `yaml:"command"`
			NetworkMode string   `yaml:"network_mode"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(readDeployFile(t, composeFile), &compose); err != nil {
		t.Fatal(err)
	}
	// The roles' default -listen ports (README.md, Configuration).
	ports := map[string]string{"ingest": "8081", "converge": "8082", "fanout": "8083"}
	for name, svc := range compose.Services {
		var want string
		switch {
		case strings.HasPrefix(svc.NetworkMode, "service:"):
			i := slices.Index(svc.Command, "-p")
			if i < 0 || i+1 >= len(svc.Command) {
				t.Errorf("compose service %s: an exporter without -p", name)
				continue
			}
			want = strings.TrimPrefix(svc.NetworkMode, "service:") + ":" + svc.Command[i+1]
		case len(svc.Command) > 0 && strings.HasPrefix(svc.Command[0], "/usr/local/bin/") && len(svc.Command) > 1 && svc.Command[1] != "provision":
			want = name + ":" + ports[filepath.Base(svc.Command[0])]
		default:
			continue
		}
		if !targets[want] {
			t.Errorf("deploy/prometheus/prometheus.yml does not scrape %s (compose service %s)", want, name)
		}
	}
	path, err := exec.LookPath("promtool")
	if err != nil {
		return
	}
	if out, err := exec.Command(path, "check", "config", "--syntax-only", filepath.Join(repoRoot(t), "deploy/prometheus/prometheus.yml")).CombinedOutput(); err != nil {
		t.Errorf("promtool check config: %v\n%s", err, out)
	}
	// Debian builds Prometheus without Kubernetes service discovery, so its
	// promtool cannot read kubernetes_sd_configs; an upstream build can.
	out, err := exec.Command(path, "check", "config", "--syntax-only", filepath.Join(repoRoot(t), "deploy/prometheus/prometheus-kubernetes.yml")).CombinedOutput()
	switch {
	case err != nil && strings.Contains(string(out), "field kubernetes_sd_configs not found"):
		t.Logf("promtool here has no Kubernetes service discovery; prometheus-kubernetes.yml not checked by it")
	case err != nil:
		t.Errorf("promtool check config prometheus-kubernetes.yml: %v\n%s", err, out)
	}
}

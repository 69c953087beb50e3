package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"gopkg.in/yaml.v3"
)

// command is one container's command line found in a manifest.
type command struct {
	where string
	argv  []string
}

// TestComposeAndKubernetesParse loads every manifest in deploy/ and checks
// that each role it starts accepts every flag it is given.
func TestComposeAndKubernetesParse(t *testing.T) {
	root := repoRoot(t)
	var cmds []command

	raw, err := os.ReadFile(filepath.Join(root, "deploy/compose/compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command []string `yaml:"command"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	for name, svc := range compose.Services {
		if len(svc.Command) > 0 && strings.HasPrefix(svc.Command[0], "/usr/local/bin/") {
			cmds = append(cmds, command{"compose " + name, svc.Command})
		}
	}

	for _, file := range []string{"deploy/kubernetes/nats.yaml", "deploy/kubernetes/fabric.yaml"} {
		f, err := os.Open(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(f)
		for {
			var doc struct {
				Kind string `yaml:"kind"`
				Spec struct {
					Template struct {
						Spec struct {
							Containers []struct {
								Name    string   `yaml:"name"`
								Command []string `yaml:"command"`
								Args    []string `yaml:"args"`
							} `yaml:"containers"`
						} `yaml:"spec"`
					} `yaml:"template"`
				} `yaml:"spec"`
			}
			if err := dec.Decode(&doc); err != nil {
				if err.Error() == "EOF" {
					break
				}
				t.Fatalf("%s: %v", file, err)
			}
			if doc.Kind == "" {
				t.Fatalf("%s: a document without kind", file)
			}
			for _, c := range doc.Spec.Template.Spec.Containers {
				if len(c.Command) > 0 && strings.HasPrefix(c.Command[0], "/usr/local/bin/") {
					cmds = append(cmds, command{file + " " + c.Name, append(append([]string{}, c.Command...), c.Args...)})
				}
			}
		}
		f.Close()
	}
	if len(cmds) < 7 {
		t.Fatalf("found %d role commands in the manifests, want the three roles in compose and kubernetes and the provision job", len(cmds))
	}

	bin := binaries(t)
	help := map[string]string{}
	for _, c := range cmds {
		name := filepath.Base(c.argv[0])
		args := c.argv[1:]
		var sub []string
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			sub, args = args[:1], args[1:]
		}
		key := strings.Join(append([]string{name}, sub...), " ")
		if _, ok := help[key]; !ok {
			out, _ := exec.Command(filepath.Join(bin, name), append(slices.Clone(sub), "-h")...).CombinedOutput()
			help[key] = string(out)
		}
		if name == "converge" && !slices.Contains(args, "-max-batch="+strconv.Itoa(deployMaxBatch)) {
			t.Errorf("%s: converge without -max-batch=%d, the NATS servers' batch limit", c.where, deployMaxBatch)
		}
		for _, a := range args {
			flagName, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
			if !strings.HasPrefix(a, "-") || !strings.Contains(help[key], "  -"+flagName+" ") && !strings.Contains(help[key], "  -"+flagName+"\n") {
				t.Errorf("%s: %s has no flag %q", c.where, key, a)
			}
		}
	}
}

// deployMaxBatch is the atomic batch limit of deploy/'s NATS servers and
// the -max-batch of its converge workers.
const deployMaxBatch = 10000

// TestNATSConfigsLoad parses each node's configuration the way nats-server
// does, with the passwords the environment would give.
func TestNATSConfigsLoad(t *testing.T) {
	for _, v := range []string{"INGEST", "CONVERGE", "FANOUT", "API", "ADMIN", "SYS"} {
		t.Setenv("FABRIC_"+v+"_PASSWORD", "secret-"+strings.ToLower(v))
	}
	for i := 1; i <= 3; i++ {
		path := filepath.Join(repoRoot(t), "deploy/nats", "nats-"+string(rune('0'+i))+".conf")
		opts, err := server.ProcessConfigFile(path)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if !opts.JetStream || opts.Cluster.Name != "fabric" || len(opts.Routes) != 3 {
			t.Errorf("%s: jetstream %v cluster %q routes %d", path, opts.JetStream, opts.Cluster.Name, len(opts.Routes))
		}
		// converge's -max-batch in compose and kubernetes is this limit.
		if got := opts.JetStreamLimits.MaxBatchSize; got != deployMaxBatch {
			t.Errorf("%s: atomic batch limit %d, want %d as converge's -max-batch", path, got, deployMaxBatch)
		}
		users := map[string]*server.User{}
		for _, u := range opts.Users {
			users[u.Username] = u
		}
		fanout := users["fanout"]
		if fanout == nil || fanout.Permissions == nil || fanout.Permissions.Publish == nil {
			t.Fatalf("%s: no fanout user with publish permissions", path)
		}
		for _, subj := range fanout.Permissions.Publish.Allow {
			if strings.HasPrefix(subj, "fabric.") {
				t.Errorf("%s: fanout may publish %s; it must only read events", path, subj)
			}
		}
		ingest := users["ingest"]
		for _, subj := range ingest.Permissions.Publish.Allow {
			if strings.HasPrefix(subj, "fabric.ev") || subj == ">" {
				t.Errorf("%s: ingest may publish %s; it publishes input only", path, subj)
			}
		}
	}
}

// TestAlertRules checks deploy/prometheus/alerts.yml with promtool.
func TestAlertRules(t *testing.T) {
	promtool(t, nil, "check", "rules", filepath.Join(repoRoot(t), "deploy/prometheus/alerts.yml"))
}

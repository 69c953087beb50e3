package tests

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The deploy files every role command is read from.
const (
	composeFile    = "deploy/compose/compose.yaml"
	kubeFabricFile = "deploy/kubernetes/fabric.yaml"
	kubeNATSFile   = "deploy/kubernetes/nats.yaml"
)

// roleCommand is one container's command line in a deploy file, with the
// settings it gets from flags and FABRIC_ environment variables.
type roleCommand struct {
	where string // file and service or workload
	role  string // provision, ingest, api, converge or fanout
	argv  []string
	// settings are flag values by flag name, from the arguments and from
	// literal FABRIC_ variables that name a flag.
	settings map[string]string
	// secrets maps each secret variable the container gets to the deploy
	// secret it is read from (FABRIC_NATS_PASSWORD to FABRIC_INGEST_PASSWORD).
	secrets map[string]string
	// fromPod are variables set from the pod (a worker id from its name).
	fromPod []string
}

// secretVars are the variables that hold secrets, never flag values.
var secretVars = []string{"FABRIC_NATS_PASSWORD", "FABRIC_JWT_SECRET", "FABRIC_MASTER_KEY"}

// placeSpecific are settings that name a place, so compose and Kubernetes
// differ in them by design: the NATS servers' host names and the worker id.
var placeSpecific = []string{"nats-url", "worker-id"}

// key is what must agree between compose, Kubernetes and the chart.
func (c roleCommand) key() string {
	s := maps.Clone(c.settings)
	for _, k := range placeSpecific {
		delete(s, k)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", c.role, strings.Join(c.subcommand(), " "))
	for _, k := range slices.Sorted(maps.Keys(s)) {
		fmt.Fprintf(&b, " -%s=%s", k, s[k])
	}
	for _, k := range slices.Sorted(maps.Keys(c.secrets)) {
		fmt.Fprintf(&b, " %s<-%s", k, c.secrets[k])
	}
	return b.String()
}

// binary is the command's executable name; subcommand its subcommand.
func (c roleCommand) binary() string { return filepath.Base(c.argv[0]) }

func (c roleCommand) subcommand() []string {
	var sub []string
	for _, a := range c.argv[1:] {
		if strings.HasPrefix(a, "-") {
			break
		}
		sub = append(sub, a)
	}
	return sub
}

func (c roleCommand) flags() []string { return c.argv[1+len(c.subcommand()):] }

var secretRef = regexp.MustCompile(`^\$\{(FABRIC_[A-Z_]+)(:\?[^}]*)?\}$`)

// newRoleCommand reads argv and the environment into settings. env values
// are literals, or "secret:NAME" and "pod:FIELD" for references.
func newRoleCommand(t *testing.T, where, role string, argv []string, env map[string]string) roleCommand {
	t.Helper()
	c := roleCommand{where: where, role: role, argv: argv, settings: map[string]string{}, secrets: map[string]string{}}
	for _, a := range c.flags() {
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok || !strings.HasPrefix(a, "-") {
			t.Errorf("%s: argument %q is not -flag=value", where, a)
			continue
		}
		c.settings[name] = value
	}
	for k, v := range env {
		switch {
		case slices.Contains(secretVars, k):
			ref, ok := strings.CutPrefix(v, "secret:")
			if !ok {
				t.Errorf("%s: secret %s is a literal; it must come from the deploy's secrets", where, k)
			}
			c.secrets[k] = ref
		case strings.HasPrefix(v, "pod:"):
			c.fromPod = append(c.fromPod, k)
			c.settings[flagOfEnv(k)] = v
		case strings.HasPrefix(v, "secret:"):
			t.Errorf("%s: %s is read from secret %s but is no secret of the fabric", where, k, v)
		default:
			c.settings[flagOfEnv(k)] = v
		}
	}
	return c
}

func flagOfEnv(env string) string {
	return strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(env, "FABRIC_")), "_", "-")
}

// composeCommands reads every fabric container of compose.yaml.
func composeCommands(t *testing.T, raw []byte) []roleCommand {
	t.Helper()
	var compose struct {
		Services map[string]struct {
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(raw, &compose); err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	var cmds []roleCommand
	for _, name := range slices.Sorted(maps.Keys(compose.Services)) {
		svc := compose.Services[name]
		if len(svc.Command) == 0 || !strings.HasPrefix(svc.Command[0], "/usr/local/bin/") {
			continue
		}
		env := map[string]string{}
		for k, v := range svc.Environment {
			if m := secretRef.FindStringSubmatch(v); m != nil {
				v = "secret:" + m[1]
			}
			env[k] = v
		}
		role := strings.TrimSuffix(strings.TrimSuffix(name, "-a"), "-b")
		cmds = append(cmds, newRoleCommand(t, composeFile+" service "+name, role, svc.Command, env))
	}
	return cmds
}

// kubeDoc is the part of a Kubernetes manifest the tests read.
type kubeDoc struct {
	Kind     string `yaml:"kind"`
	Metadata struct {
		Name        string            `yaml:"name"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Template struct {
			Spec struct {
				Containers []kubeContainer `yaml:"containers"`
			} `yaml:"spec"`
		} `yaml:"template"`
		// An Ingress's.
		IngressClassName string `yaml:"ingressClassName"`
		Rules            []struct {
			HTTP struct {
				Paths []struct {
					Path     string `yaml:"path"`
					PathType string `yaml:"pathType"`
					Backend  struct {
						Service struct {
							Name string `yaml:"name"`
							Port struct {
								Name string `yaml:"name"`
							} `yaml:"port"`
						} `yaml:"service"`
					} `yaml:"backend"`
				} `yaml:"paths"`
			} `yaml:"http"`
		} `yaml:"rules"`
	} `yaml:"spec"`
}

type kubeContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom struct {
			SecretKeyRef struct {
				Key string `yaml:"key"`
			} `yaml:"secretKeyRef"`
			FieldRef struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
}

// kubeDocs decodes a multi-document manifest.
func kubeDocs(t *testing.T, where string, r io.Reader) []kubeDoc {
	t.Helper()
	dec := yaml.NewDecoder(r)
	var docs []kubeDoc
	for {
		var doc kubeDoc
		if err := dec.Decode(&doc); err != nil {
			if errors.Is(err, io.EOF) {
				return docs
			}
			t.Fatalf("%s: %v", where, err)
		}
		if doc.Kind == "" {
			continue
		}
		docs = append(docs, doc)
	}
}

// kubeCommands reads every fabric container of Kubernetes manifests.
func kubeCommands(t *testing.T, where string, docs []kubeDoc) []roleCommand {
	t.Helper()
	var cmds []roleCommand
	for _, doc := range docs {
		for _, c := range doc.Spec.Template.Spec.Containers {
			if len(c.Command) == 0 || !strings.HasPrefix(c.Command[0], "/usr/local/bin/") {
				continue
			}
			env := map[string]string{}
			for _, e := range c.Env {
				switch {
				case e.ValueFrom.SecretKeyRef.Key != "":
					env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Key
				case e.ValueFrom.FieldRef.FieldPath != "":
					env[e.Name] = "pod:" + e.ValueFrom.FieldRef.FieldPath
				default:
					env[e.Name] = e.Value
				}
			}
			role := strings.TrimPrefix(doc.Metadata.Name, "fabric-")
			argv := append(slices.Clone(c.Command), c.Args...)
			cmds = append(cmds, newRoleCommand(t, where+" "+doc.Kind+" "+doc.Metadata.Name, role, argv, env))
		}
	}
	return cmds
}

func readDeployFile(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// deployRoles reads the role commands of compose, the Kubernetes manifests
// and the Helm chart, checks that they agree role by role, and returns one
// command per role (compose's; converge once) with the files it read.
func deployRoles(t *testing.T) (map[string]roleCommand, []string) {
	t.Helper()
	files := []string{composeFile, kubeFabricFile}
	sources := map[string][]roleCommand{
		"compose":    composeCommands(t, readDeployFile(t, composeFile)),
		"kubernetes": kubeCommands(t, kubeFabricFile, kubeDocs(t, kubeFabricFile, strings.NewReader(string(readDeployFile(t, kubeFabricFile))))),
	}
	chart, chartFiles := renderChart(t, nil)
	files = append(files, chartFiles...)
	sources["helm"] = kubeCommands(t, helmChartDir, kubeDocs(t, helmChartDir, strings.NewReader(chart)))

	want := []string{"api", "converge", "fanout", "ingest", "provision"}
	byRole := map[string]map[string]roleCommand{}
	for src, cmds := range sources {
		for _, c := range cmds {
			if byRole[c.role] == nil {
				byRole[c.role] = map[string]roleCommand{}
			}
			if prev, ok := byRole[c.role][src]; ok && prev.key() != c.key() {
				t.Errorf("%s and %s run role %s differently:\n  %s\n  %s", prev.where, c.where, c.role, prev.key(), c.key())
			}
			byRole[c.role][src] = c
		}
	}
	if got := slices.Sorted(maps.Keys(byRole)); !slices.Equal(got, want) {
		t.Fatalf("the deploy files run roles %v, want %v", got, want)
	}
	out := map[string]roleCommand{}
	for _, role := range want {
		ref, ok := byRole[role]["compose"]
		if !ok {
			t.Fatalf("compose does not run %s", role)
		}
		for _, src := range slices.Sorted(maps.Keys(sources)) {
			c, ok := byRole[role][src]
			if !ok {
				t.Errorf("%s does not run %s", src, role)
				continue
			}
			if c.key() != ref.key() {
				t.Errorf("role %s drifted between compose and %s:\n  %s: %s\n  %s: %s", role, src, ref.where, ref.key(), c.where, c.key())
			}
		}
		out[role] = ref
	}
	return out, files
}

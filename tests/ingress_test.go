package tests

import (
	"cmp"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fabric-mls/fabric/internal/clientapi"
	"github.com/fabric-mls/fabric/internal/fanout"
	"github.com/fabric-mls/fabric/internal/ingest"
)

// ingressRule is one path of an Ingress and the Service it goes to.
type ingressRule struct {
	Path, PathType, Service, Port string
}

// ingressOf is the one Ingress of a deploy file: its class, annotations and
// rules, longest path first.
type ingressOf struct {
	Class       string
	Annotations map[string]string
	Rules       []ingressRule
}

func readIngress(t *testing.T, where string, docs []kubeDoc) ingressOf {
	t.Helper()
	var found []ingressOf
	for _, d := range docs {
		if d.Kind != "Ingress" {
			continue
		}
		in := ingressOf{Class: d.Spec.IngressClassName, Annotations: d.Metadata.Annotations}
		for _, r := range d.Spec.Rules {
			for _, p := range r.HTTP.Paths {
				in.Rules = append(in.Rules, ingressRule{p.Path, p.PathType, p.Backend.Service.Name, p.Backend.Service.Port.Name})
			}
		}
		// The controller tries regular-expression paths longest first
		// (ingress-nginx, "Path priority"): the order does not depend on
		// the file's.
		slices.SortStableFunc(in.Rules, func(a, b ingressRule) int { return cmp.Compare(len(b.Path), len(a.Path)) })
		found = append(found, in)
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d Ingresses, want 1", where, len(found))
	}
	return found[0]
}

// route is the Service the controller sends path to: the first rule,
// longest path first, whose path matches as a regular expression anchored
// at the path's start, as ingress-nginx reads ImplementationSpecific paths
// with use-regex.
func (in ingressOf) route(path string) string {
	for _, r := range in.Rules {
		if regexp.MustCompile("^" + r.Path).MatchString(path) {
			return r.Service
		}
	}
	return ""
}

// roleMux answers, for a request, the deploy workload whose role serves it,
// from the routes the roles mount (ingest.Service.Mount, clientapi.API.Mount,
// fanout.Gateway.Mount) with net/http's own precedence, as the all-in-one
// resolves them on one mux: ingest's routes to the transport intake
// (ingest), the client API's to api, the gateway's to fanout.
func roleMux() (*http.ServeMux, map[string][]string) {
	roles := map[string][]string{
		"fabric-ingest": {ingest.RouteTransport, ingest.RouteOutcome},
		"fabric-api":    clientapi.Routes,
		"fabric-fanout": {fanout.RouteWebSocket, fanout.RouteSSE, fanout.RouteConnectionTokens, fanout.RouteSubscriptions},
	}
	mux := http.NewServeMux()
	for svc, patterns := range roles {
		for _, p := range patterns {
			mux.HandleFunc(p, func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, svc) })
		}
	}
	return mux, roles
}

var patternParam = regexp.MustCompile(`\{[^}]+\}`)

// ingressRequests are requests to every route the roles serve (path
// parameters filled in), and below the client API's subtree
// (/v1/tenants/{tenant}/clients/…) one of each kind of path.
func ingressRequests(roles map[string][]string) [][2]string {
	var reqs [][2]string
	for _, svc := range slices.Sorted(maps.Keys(roles)) {
		for _, p := range roles[svc] {
			method, path, ok := strings.Cut(p, " ")
			if !ok {
				method, path = http.MethodGet, p
			}
			reqs = append(reqs, [2]string{method, patternParam.ReplaceAllString(path, "ab12")})
		}
	}
	for _, sub := range []string{"ab12", "ab12/conversations", "ab12/conversations/cd/messages", "ab12/conversations/cd/members/ef",
		"ab12/messages/cd", "ab12/signals", "ab12/connection", "ab12/consent", "ab12/identities/ef", "ab12/operations/cd", "ab12/key-packages",
		"ab12/events"} {
		reqs = append(reqs, [2]string{http.MethodGet, "/v1/tenants/acme/clients/" + sub})
	}
	return reqs
}

// checkIngressRoutes (issue 28, item 8): the Ingress of the Kubernetes
// manifests and of the chart send every request to the workload whose role
// serves it, and every rule is used.
func checkIngressRoutes(t *testing.T) {
	kube := readIngress(t, kubeFabricFile, kubeDocs(t, kubeFabricFile, strings.NewReader(string(readDeployFile(t, kubeFabricFile)))))
	chart, _ := renderChart(t, nil)
	helm := readIngress(t, helmChartDir, kubeDocs(t, helmChartDir, strings.NewReader(chart)))
	if fmt.Sprint(kube) != fmt.Sprint(helm) {
		t.Errorf("the chart's Ingress differs from %s's:\n  %+v\n  %+v", kubeFabricFile, helm, kube)
	}
	if kube.Annotations["nginx.ingress.kubernetes.io/use-regex"] != "true" {
		t.Errorf("%s: the Ingress's paths are regular expressions; it needs nginx.ingress.kubernetes.io/use-regex", kubeFabricFile)
	}
	mux, roles := roleMux()
	used := map[string]bool{}
	for _, req := range ingressRequests(roles) {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(req[0], req[1], nil))
		want := rec.Body.String()
		if !strings.HasPrefix(want, "fabric-") {
			t.Fatalf("%s %s: no role serves it (%d)", req[0], req[1], rec.Code)
		}
		got := kube.route(req[1])
		if got != want {
			t.Errorf("%s: the Ingress sends %s %s to %q; %s serves it", kubeFabricFile, req[0], req[1], got, want)
		}
		for _, r := range kube.Rules {
			if got == r.Service && regexp.MustCompile("^"+r.Path).MatchString(req[1]) {
				used[r.Path] = true
				break
			}
		}
	}
	for _, r := range kube.Rules {
		if r.PathType != "ImplementationSpecific" || r.Port != "http" {
			t.Errorf("%s: rule %s: pathType %q port %q, want ImplementationSpecific and http", kubeFabricFile, r.Path, r.PathType, r.Port)
		}
		if !used[r.Path] {
			t.Errorf("%s: rule %s -> %s serves no route of the roles", kubeFabricFile, r.Path, r.Service)
		}
	}
	for _, path := range []string{"/metrics", "/healthz", "/readyz", "/console/"} {
		if svc := kube.route(path); svc != "" {
			t.Errorf("%s: the Ingress exposes %s (to %s)", kubeFabricFile, path, svc)
		}
	}
}

// Package api_test checks the machine-readable contract (issue 20):
// events.schema.json (JSON Schema 2020-12: every ClientEvent kind and
// payload, the EventFilter, the WebSocket frames) and openapi.yaml (OpenAPI
// 3.1: every HTTP route, and the bodies of exported Go types) against the Go
// code, so an SDK generated from them in another language cannot drift.
//
// The expected schema is derived from the Go types by reflection (JSON
// member names from the tags; a pointer, omitempty or omitzero member is optional)
// and compared with the files' structure; descriptions in the files are
// free. go test ./api -update rewrites events.schema.json from the Go code.
package api_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/fabric-mls/fabric/internal/auth"
	"github.com/fabric-mls/fabric/internal/fanout"
	"github.com/fabric-mls/fabric/internal/ingest"
	"github.com/fabric-mls/fabric/internal/refusal"
	"github.com/fabric-mls/fabric/internal/signals"
	"github.com/fabric-mls/fabric/pkg/schema"
	"github.com/fabric-mls/fabric/pkg/wire"
)

var update = flag.Bool("update", false, "rewrite events.schema.json from the Go code")

const eventsFile = "events.schema.json"

// body is an HTTP route whose request or response body is an exported Go
// type; openapi.yaml must reference the type's schema there.
type body struct {
	route      string
	req, resp  reflect.Type
	respStatus string
}

var bodies = []body{
	{"POST /v1/tenants/{tenant}/connection-tokens", typeOf[fanout.ConnectionTokenRequest](), typeOf[fanout.ConnectionTokenResponse](), "201"},
	{"GET /v1/tenants/{tenant}/subscriptions", nil, typeOf[fanout.SubscriptionList](), "200"},
	{"POST /v1/tenants/{tenant}/transport", nil, typeOf[ingest.Response](), "200"},
	{"GET /v1/tenants/{tenant}/outcomes/{message_id}", nil, typeOf[schema.Outcome](), "200"},
	{"POST /v1/tenants/{tenant}/clients/{client_id}/signals", nil, typeOf[signals.Answer](), "200"},
	{"POST /v1/tenants/{tenant}/clients/{client_id}/connection", typeOf[signals.StreamReport](), typeOf[signals.Answer](), "200"},
	{"GET /v1/tenants/{tenant}/clients/{client_id}/conversations", nil, typeOf[schema.ConversationPage](), "200"},
	{"GET /v1/tenants/{tenant}/clients/{client_id}/conversations/{group_id}", nil, typeOf[schema.Conversation](), "200"},
	{"GET /v1/tenants/{tenant}/clients/{client_id}/conversations/{group_id}/members", nil, typeOf[schema.MemberList](), "200"},
	{"GET /v1/tenants/{tenant}/clients/{client_id}/conversations/{group_id}/messages", nil, typeOf[schema.MessagePage](), "200"},
	{"GET /v1/tenants/{tenant}/clients/{client_id}/messages/{message_id}", nil, typeOf[schema.Message](), "200"},
	{"GET /v1/tenants/{tenant}/clients/{client_id}/consent", nil, typeOf[schema.ConsentPage](), "200"},
	{"GET /v1/tenants/{tenant}/clients/{client_id}/identities", nil, typeOf[schema.IdentityPage](), "200"},
	{"POST /v1/tenants/{tenant}/clients/{client_id}/conversations", typeOf[schema.CreateConversation](), typeOf[schema.OperationAccepted](), "202"},
	{"POST /v1/tenants/{tenant}/clients/{client_id}/conversations/{group_id}/messages", typeOf[schema.SendMessage](), typeOf[schema.OperationAccepted](), "202"},
	{"POST /v1/tenants/{tenant}/clients/{client_id}/conversations/{group_id}/members", typeOf[schema.AddMembers](), typeOf[schema.OperationAccepted](), "202"},
	{"DELETE /v1/tenants/{tenant}/clients/{client_id}/conversations/{group_id}/members/{inbox_id}", nil, typeOf[schema.OperationAccepted](), "202"},
	{"PATCH /v1/tenants/{tenant}/clients/{client_id}/conversations/{group_id}", typeOf[schema.ConversationChanges](), typeOf[schema.OperationAccepted](), "202"},
	{"POST /v1/tenants/{tenant}/clients/{client_id}/conversations/{group_id}/leave", nil, typeOf[schema.OperationAccepted](), "202"},
	{"POST /v1/tenants/{tenant}/clients/{client_id}/conversations/{group_id}/update", nil, typeOf[schema.OperationAccepted](), "202"},
	{"GET /v1/tenants/{tenant}/clients/{client_id}/operations/{operation_id}", nil, typeOf[schema.Operation](), "200"},
}

// errorBody is every refusal's body (internal/httpapi.WriteError).
type errorBody struct {
	Error refusal.Error `json:"error"`
}

// componentNames name Go types whose own name says too little in the API.
var componentNames = map[reflect.Type]string{
	typeOf[errorBody]():       "Error",
	typeOf[refusal.Error]():   "ErrorDetail",
	typeOf[ingest.Response](): "TransportResponse",
	typeOf[ingest.Result]():   "TransportResult",
	typeOf[signals.Answer]():  "SignalAnswer",
}

func typeOf[T any]() reflect.Type { return reflect.TypeFor[T]() }

// builder derives JSON Schema from Go types. Types of pkg/schema and
// pkg/wire go to events (the $defs of events.schema.json); the others to
// components (openapi.yaml's components.schemas).
type builder struct {
	inEvents   bool // building events.schema.json: its own types are local refs
	enums      map[string][]string
	events     map[string]any
	components map[string]any
}

func newBuilder(t *testing.T) *builder {
	return &builder{enums: enumValues(t), events: map[string]any{}, components: map[string]any{}}
}

func shared(t reflect.Type) bool {
	return t.PkgPath() == typeOf[schema.Bytes]().PkgPath() || t.PkgPath() == typeOf[wire.Frame]().PkgPath()
}

func (b *builder) name(t reflect.Type) string {
	if n, ok := componentNames[t]; ok {
		return n
	}
	return t.Name()
}

// ref is where t's schema is referenced from the file being built.
func (b *builder) ref(t reflect.Type) map[string]any {
	switch {
	case shared(t) && b.inEvents:
		return map[string]any{"$ref": "#/$defs/" + b.name(t)}
	case shared(t):
		return map[string]any{"$ref": eventsFile + "#/$defs/" + b.name(t)}
	}
	return map[string]any{"$ref": "#/components/schemas/" + b.name(t)}
}

// define records t's schema under its name and returns the reference.
func (b *builder) define(t reflect.Type, def func() any) map[string]any {
	defs := b.components
	if shared(t) {
		defs = b.events
	}
	ref := b.ref(t)
	if _, done := defs[b.name(t)]; !done {
		defs[b.name(t)] = nil // a recursive type refers to itself
		// The definition's own references are written from the file it
		// lands in, whoever reached it first.
		outer := b.inEvents
		b.inEvents = shared(t)
		defs[b.name(t)] = def()
		b.inEvents = outer
	}
	return ref
}

// of returns the schema of a Go type in its JSON encoding.
func (b *builder) of(t reflect.Type) any {
	switch {
	case t == typeOf[schema.Bytes]():
		return b.define(t, func() any { return map[string]any{"type": "string", "pattern": "^([0-9a-f]{2})*$"} })
	case t == typeOf[time.Time]():
		return map[string]any{"type": "string", "format": "date-time"}
	case t == typeOf[schema.ClientEvent]():
		return b.define(t, b.clientEvent)
	case t.Kind() == reflect.Pointer:
		return b.of(t.Elem())
	}
	switch t.Kind() {
	case reflect.String:
		values := b.enums[t.PkgPath()+"."+t.Name()]
		if len(values) == 0 {
			return map[string]any{"type": "string"}
		}
		return b.define(t, func() any { return map[string]any{"type": "string", "enum": values} })
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer", "minimum": 0}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": b.of(t.Elem())}
	case reflect.Struct:
		return b.define(t, func() any { return b.object(t) })
	case reflect.Map:
		if t.Key().Kind() == reflect.String {
			return map[string]any{"type": "object", "additionalProperties": b.of(t.Elem())}
		}
	}
	panic(fmt.Sprintf("no JSON Schema for %v", t))
}

// object is a struct's schema: its JSON members, required unless a pointer
// or omitempty, and no others.
func (b *builder) object(t reflect.Type) any {
	props := map[string]any{}
	required := []any{}
	for f := range t.Fields() {
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		props[name] = b.of(f.Type)
		if f.Type.Kind() != reflect.Pointer && !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") {
			required = append(required, name)
		}
	}
	o := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		o["required"] = required
	}
	return o
}

// clientEvent is ClientEvent: one branch per kind, each with its kind and
// the one payload member the kind table names (schema.EventKind.Member).
func (b *builder) clientEvent() any {
	members := map[string]reflect.Type{}
	for f := range typeOf[schema.ClientEvent]().Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue // not encoded (the id the SDK sets from the frame)
		}
		members[name] = f.Type
	}
	var branches []any
	for _, k := range schema.AllKinds() {
		m := k.Member()
		ft, ok := members[m]
		if !ok {
			panic("kind " + string(k) + " has no ClientEvent member " + m)
		}
		delete(members, m)
		branches = append(branches, map[string]any{
			"type":                 "object",
			"properties":           map[string]any{"kind": map[string]any{"const": string(k)}, m: b.of(ft)},
			"required":             []any{"kind", m},
			"additionalProperties": false,
		})
	}
	delete(members, "kind")
	for m := range members {
		panic("ClientEvent member " + m + " is no kind's payload")
	}
	return map[string]any{"oneOf": branches}
}

// frame is the WebSocket frame: op, and every member pkg/wire encodes, with
// the type of the value it encodes for it.
func (b *builder) frame(ops []string) any {
	ft := typeOf[wire.Frame]()
	b.define(ft, func() any {
		var f wire.Frame
		v := reflect.ValueOf(&f).Elem()
		for i := range v.NumField() {
			switch fv := v.Field(i); fv.Kind() {
			case reflect.String:
				fv.SetString("x")
			case reflect.Int64:
				fv.SetInt(1)
			case reflect.Uint64:
				fv.SetUint(1)
			case reflect.Bool:
				fv.SetBool(true)
			}
		}
		f.Filter = &schema.EventFilter{Kinds: []schema.EventKind{}}
		f.Event = []byte(`{}`)
		var members map[string]json.RawMessage
		if err := json.Unmarshal(wire.Append(wire.JSON, nil, &f), &members); err != nil {
			panic(err)
		}
		props := map[string]any{}
		for name, raw := range members {
			switch {
			case name == "op":
				props[name] = map[string]any{"type": "string", "enum": toAny(ops)}
			case name == "filter":
				props[name] = b.of(typeOf[schema.EventFilter]())
			case name == "event":
				props[name] = b.of(typeOf[schema.ClientEvent]())
			case raw[0] == '"':
				props[name] = map[string]any{"type": "string"}
			case raw[0] == 't':
				props[name] = map[string]any{"type": "boolean"}
			default:
				props[name] = map[string]any{"type": "integer"}
			}
		}
		return map[string]any{"type": "object", "properties": props, "required": []any{"op"}, "additionalProperties": false}
	})
	return b.ref(ft)
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// eventsSchema is what events.schema.json must say.
func eventsSchema(b *builder, kinds []schema.EventKind, ops []string) map[string]any {
	b.inEvents = true
	defer func() { b.inEvents = false }()
	b.of(typeOf[schema.ClientEvent]())
	b.of(typeOf[schema.EventFilter]())
	b.of(typeOf[schema.TransportMessage]())
	b.of(typeOf[schema.Outcome]())
	b.frame(ops)
	kindEnum := map[string]any{"type": "string", "enum": toAny(stringsOf(kinds))}
	b.events["EventKind"] = kindEnum
	return map[string]any{
		"$schema": "https://json-schema.org/draft/2020-12/schema",
		"title":   "fabric client events, filter, transport message, outcome and WebSocket frames",
		"$defs":   b.events,
	}
}

func stringsOf[S ~string](in []S) []string {
	out := make([]string, len(in))
	for i, s := range in {
		out[i] = string(s)
	}
	return out
}

// enumValues reads the typed string constants of pkg/schema and the scopes
// of internal/auth: the values of each enum type, in source order.
func enumValues(t *testing.T) map[string][]string {
	out := map[string][]string{}
	for dir, pkg := range map[string]reflect.Type{"../pkg/schema": typeOf[schema.EventKind]()} {
		for _, c := range typedConsts(t, dir) {
			out[pkg.PkgPath()+"."+c.typ] = append(out[pkg.PkgPath()+"."+c.typ], c.value)
		}
	}
	scope := typeOf[auth.Scope]()
	out[scope.PkgPath()+"."+scope.Name()] = slices.Sorted(maps.Keys(stringKeys(auth.DefaultLifetimes)))
	return out
}

func stringKeys[K ~string, V any](m map[K]V) map[string]V {
	out := map[string]V{}
	for k, v := range m {
		out[string(k)] = v
	}
	return out
}

type typedConst struct{ name, typ, value string }

// typedConsts lists the string constants with an explicit type in the Go
// files (not tests) of dir, in source order.
func typedConsts(t *testing.T, dir string) []typedConst {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	sort.Strings(files)
	var out []typedConst
	fset := token.NewFileSet()
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, s := range gd.Specs {
				vs := s.(*ast.ValueSpec)
				id, ok := vs.Type.(*ast.Ident)
				if !ok || len(vs.Values) != len(vs.Names) {
					continue
				}
				for i, v := range vs.Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						out = append(out, typedConst{vs.Names[i].Name, id.Name, s})
					}
				}
			}
		}
	}
	return out
}

// wireOps are pkg/wire's Op constants.
func wireOps(t *testing.T) []string {
	t.Helper()
	var ops []string
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "../pkg/wire/wire.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok {
			for i, name := range vs.Names {
				if i >= len(vs.Values) || !strings.HasPrefix(name.Name, "Op") {
					continue
				}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok {
					s, _ := strconv.Unquote(lit.Value)
					ops = append(ops, s)
				}
			}
		}
		return true
	})
	return ops
}

var routePattern = regexp.MustCompile(`^(GET|POST|PUT|PATCH|DELETE) (/[^ ]*)$`)

// goRoutes finds every ServeMux pattern the roles register: each call
// argument or composite literal element in the Go files (not tests) under
// internal/ and cmd/ that is a constant string expression of a method and a
// path. Constants resolve across a package's files, inside functions, and
// across packages (pkg.Name).
func goRoutes(t *testing.T) []string {
	t.Helper()
	type file struct {
		pkg string
		f   *ast.File
	}
	var files []file
	for _, root := range []string{"../internal", "../cmd"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				return err
			}
			files = append(files, file{filepath.Dir(path), f})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Package-level constants, by directory and by package name; a few
	// passes resolve constants defined from others.
	byDir := map[string]map[string]string{}
	byName := map[string]map[string]string{}
	for range 3 {
		for _, f := range files {
			consts := byDir[f.pkg]
			if consts == nil {
				consts = map[string]string{}
				byDir[f.pkg], byName[f.f.Name.Name] = consts, consts
			}
			for _, d := range f.f.Decls {
				if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.CONST {
					collectConsts(gd, consts, byName)
				}
			}
		}
	}
	routes := map[string]bool{}
	for _, f := range files {
		for _, d := range f.f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			local := maps.Clone(byDir[f.pkg])
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				var candidates []ast.Expr
				switch n := n.(type) {
				case *ast.GenDecl:
					if n.Tok == token.CONST {
						collectConsts(n, local, byName)
					}
				case *ast.CallExpr:
					candidates = n.Args
				case *ast.CompositeLit:
					candidates = n.Elts
				}
				for _, e := range candidates {
					if s, ok := constString(e, local, byName); ok && routePattern.MatchString(s) {
						routes[s] = true
					}
				}
				return true
			})
		}
	}
	return slices.Sorted(maps.Keys(routes))
}

// collectConsts adds the string constants of a const declaration.
func collectConsts(gd *ast.GenDecl, consts map[string]string, byName map[string]map[string]string) {
	for _, spec := range gd.Specs {
		vs := spec.(*ast.ValueSpec)
		for i, name := range vs.Names {
			if i < len(vs.Values) {
				if s, ok := constString(vs.Values[i], consts, byName); ok {
					consts[name.Name] = s
				}
			}
		}
	}
}

// constString evaluates a string literal, a constant (Name or pkg.Name), or
// a sum of them.
func constString(e ast.Expr, consts map[string]string, byName map[string]map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		s, err := strconv.Unquote(e.Value)
		return s, err == nil
	case *ast.Ident:
		s, ok := consts[e.Name]
		return s, ok
	case *ast.SelectorExpr:
		if pkg, ok := e.X.(*ast.Ident); ok {
			s, ok := byName[pkg.Name][e.Sel.Name]
			return s, ok
		}
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		l, lok := constString(e.X, consts, byName)
		r, rok := constString(e.Y, consts, byName)
		return l + r, lok && rok
	}
	return "", false
}

// strip removes what the files may add for readers: descriptions, titles,
// examples, comments.
func strip(v any) any {
	switch v := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, x := range v {
			switch k {
			case "description", "title", "examples", "$comment", "deprecated":
				continue
			}
			out[k] = strip(x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = strip(x)
		}
		return out
	case int:
		return float64(v)
	}
	return v
}

// normalize passes v through JSON, so Go-built and file-read values compare.
func normalize(v any) any {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	var out any
	if err := json.Unmarshal(b, &out); err != nil {
		panic(err)
	}
	return strip(out)
}

// diffDefs reports each definition the Go code has and the file has not, or
// has with another shape, and each the file has that the Go code has not.
func diffDefs(where string, want, got map[string]any) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(want)) {
		g, ok := got[name]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s: %s is missing", where, name))
		case !reflect.DeepEqual(normalize(want[name]), normalize(g)):
			w, _ := json.Marshal(normalize(want[name]))
			h, _ := json.Marshal(normalize(g))
			out = append(out, fmt.Sprintf("%s: %s differs from the Go code:\n  Go:   %s\n  file: %s", where, name, w, h))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(got)) {
		if _, ok := want[name]; !ok {
			out = append(out, fmt.Sprintf("%s: %s is not in the Go code", where, name))
		}
	}
	return out
}

// openAPI is the part of openapi.yaml the check reads.
type openAPI struct {
	OpenAPI    string                          `yaml:"openapi"`
	Paths      map[string]map[string]openAPIOp `yaml:"paths"`
	Components struct {
		Schemas    map[string]any
		Parameters map[string]openAPIParam
	} `yaml:"components"`
}

// openAPIParam is a parameter, or a reference to one of
// components.parameters.
type openAPIParam struct {
	Ref      string `yaml:"$ref"`
	Name, In string
	Required bool
}

type openAPIOp struct {
	Parameters  []openAPIParam `yaml:"parameters"`
	RequestBody *struct {
		Content map[string]struct{ Schema any }
	} `yaml:"requestBody"`
	Responses map[string]struct {
		Content map[string]struct{ Schema any }
	} `yaml:"responses"`
}

var pathParam = regexp.MustCompile(`\{([^}]+)\}`)

// diffRoutes reports each route the Go code serves that openapi.yaml does
// not describe (with its path parameters), each it describes that no code
// serves, and each body that does not reference its Go type's schema.
func diffRoutes(api openAPI, routes []string, bodies []body, b *builder) []string {
	var out []string
	described := map[string]bool{}
	for path, ops := range api.Paths {
		for method := range ops {
			described[strings.ToUpper(method)+" "+path] = true
		}
	}
	for _, r := range routes {
		if !described[r] {
			out = append(out, "openapi.yaml: route "+r+" is missing")
			continue
		}
		delete(described, r)
		m := routePattern.FindStringSubmatch(r)
		op := api.Paths[m[2]][strings.ToLower(m[1])]
		var declared []string
		for _, p := range op.Parameters {
			if p.In == "path" {
				declared = append(declared, p.Name)
			}
		}
		var want []string
		for _, p := range pathParam.FindAllStringSubmatch(m[2], -1) {
			want = append(want, p[1])
		}
		if !slices.Equal(slices.Sorted(slices.Values(declared)), slices.Sorted(slices.Values(want))) {
			out = append(out, fmt.Sprintf("openapi.yaml: %s declares path parameters %v, the route has %v", r, declared, want))
		}
	}
	for _, r := range slices.Sorted(maps.Keys(described)) {
		out = append(out, "openapi.yaml: "+r+" is served by no Go code")
	}
	for _, bd := range bodies {
		m := routePattern.FindStringSubmatch(bd.route)
		op, ok := api.Paths[m[2]][strings.ToLower(m[1])]
		if !ok {
			continue
		}
		if bd.req != nil {
			var got any
			if op.RequestBody != nil {
				got = op.RequestBody.Content["application/json"].Schema
			}
			if want := b.of(bd.req); !reflect.DeepEqual(normalize(want), normalize(got)) {
				out = append(out, fmt.Sprintf("openapi.yaml: %s request body is %v, want %v", bd.route, got, want))
			}
		}
		got := op.Responses[bd.respStatus].Content["application/json"].Schema
		if want := b.of(bd.resp); !reflect.DeepEqual(normalize(want), normalize(got)) {
			out = append(out, fmt.Sprintf("openapi.yaml: %s %s response is %v, want %v", bd.route, bd.respStatus, got, want))
		}
	}
	return out
}

func readEvents(t *testing.T) map[string]any {
	t.Helper()
	raw, err := os.ReadFile(eventsFile)
	if err != nil {
		t.Fatal(err)
	}
	var file map[string]any
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatalf("%s: %v", eventsFile, err)
	}
	defs, _ := file["$defs"].(map[string]any)
	return defs
}

func readOpenAPI(t *testing.T) openAPI {
	t.Helper()
	raw, err := os.ReadFile("openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var api openAPI
	if err := yaml.Unmarshal(raw, &api); err != nil {
		t.Fatalf("openapi.yaml: %v", err)
	}
	return api
}

// The contract files say what the Go code does: every event kind with its
// payload member and type, the filter, the frames and their ops, every
// route with its path parameters, and the bodies of exported Go types.
func TestContractMatchesTheGoCode(t *testing.T) {
	b := newBuilder(t)
	want := eventsSchema(b, schema.AllKinds(), wireOps(t))
	b.of(typeOf[errorBody]())
	for _, bd := range bodies {
		if bd.req != nil {
			b.of(bd.req)
		}
		b.of(bd.resp)
	}
	if *update {
		out, err := json.MarshalIndent(normalize(want), "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(eventsFile, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	api := readOpenAPI(t)
	if !strings.HasPrefix(api.OpenAPI, "3.1.") {
		t.Errorf("openapi.yaml is OpenAPI %q, want 3.1", api.OpenAPI)
	}
	problems := diffDefs(eventsFile, b.events, readEvents(t))
	problems = append(problems, diffDefs("openapi.yaml components", b.components, api.Components.Schemas)...)
	problems = append(problems, diffRoutes(api, goRoutes(t), bodies, b)...)
	for _, p := range problems {
		t.Error(p)
	}
	if len(goRoutes(t)) < 15 {
		t.Errorf("found %d routes in the Go code; the scan lost some", len(goRoutes(t)))
	}
}

// messageReceivedWithExtra is message.received's payload with a member
// added, as a change to the Go code would add it.
type messageReceivedWithExtra struct {
	schema.MessageReceived
	Edited bool `json:"edited"`
}

// The check fails when the Go code gains a kind, a payload member or a
// route that the contract does not have.
func TestContractCheckCatchesAdditions(t *testing.T) {
	defs := readEvents(t)
	api := readOpenAPI(t)

	b := newBuilder(t)
	eventsSchema(b, append(schema.AllKinds(), "message.edited"), wireOps(t))
	if got := diffDefs(eventsFile, b.events, defs); !containsAll(got, "EventKind differs") {
		t.Errorf("an added kind is not caught: %q", got)
	}

	b = newBuilder(t)
	eventsSchema(b, schema.AllKinds(), append(wireOps(t), "refresh"))
	if got := diffDefs(eventsFile, b.events, defs); !containsAll(got, "Frame differs") {
		t.Errorf("an added frame op is not caught: %q", got)
	}

	b = newBuilder(t)
	eventsSchema(b, schema.AllKinds(), wireOps(t))
	b.inEvents = true
	b.events["MessageReceived"] = b.object(typeOf[messageReceivedWithExtra]())
	if got := diffDefs(eventsFile, b.events, defs); !containsAll(got, "MessageReceived differs", `"edited"`) {
		t.Errorf("an added payload member is not caught: %q", got)
	}

	b = newBuilder(t)
	routes := append(goRoutes(t), "GET /v1/tenants/{tenant}/clients/{client_id}/messages")
	if got := diffRoutes(api, routes, bodies, b); !containsAll(got, "route GET /v1/tenants/{tenant}/clients/{client_id}/messages is missing") {
		t.Errorf("an added route is not caught: %q", got)
	}
}

func containsAll(problems []string, parts ...string) bool {
	all := strings.Join(problems, "\n")
	for _, p := range parts {
		if !strings.Contains(all, p) {
			return false
		}
	}
	return true
}

// validate checks v against the subset of JSON Schema the contract uses:
// $ref (within the file), oneOf, const, enum, type, properties, required,
// additionalProperties false, items, pattern, minimum.
func validate(defs map[string]any, s map[string]any, v any, at string) error {
	if ref, ok := s["$ref"].(string); ok {
		def, ok := defs[strings.TrimPrefix(ref, "#/$defs/")].(map[string]any)
		if !ok {
			return fmt.Errorf("%s: unknown $ref %s", at, ref)
		}
		return validate(defs, def, v, at)
	}
	if branches, ok := s["oneOf"].([]any); ok {
		n := 0
		for _, b := range branches {
			if validate(defs, b.(map[string]any), v, at) == nil {
				n++
			}
		}
		if n != 1 {
			return fmt.Errorf("%s: matches %d branches of oneOf, want 1", at, n)
		}
		return nil
	}
	if c, ok := s["const"]; ok && !reflect.DeepEqual(c, v) {
		return fmt.Errorf("%s: %v is not %v", at, v, c)
	}
	if e, ok := s["enum"].([]any); ok && !slices.Contains(e, v) {
		return fmt.Errorf("%s: %v is not one of %v", at, v, e)
	}
	switch s["type"] {
	case "object":
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an object", at, v)
		}
		props, _ := s["properties"].(map[string]any)
		for _, r := range asSlice(s["required"]) {
			if _, ok := m[r.(string)]; !ok {
				return fmt.Errorf("%s: lacks %s", at, r)
			}
		}
		for k, x := range m {
			p, ok := props[k].(map[string]any)
			if !ok {
				return fmt.Errorf("%s: member %s is not in the schema", at, k)
			}
			if err := validate(defs, p, x, at+"."+k); err != nil {
				return err
			}
		}
	case "array":
		a, ok := v.([]any)
		if !ok {
			return fmt.Errorf("%s: %v is not an array", at, v)
		}
		for i, x := range a {
			if err := validate(defs, s["items"].(map[string]any), x, fmt.Sprintf("%s[%d]", at, i)); err != nil {
				return err
			}
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			return fmt.Errorf("%s: %v is not a string", at, v)
		}
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(str) {
			return fmt.Errorf("%s: %q does not match %s", at, str, p)
		}
	case "integer":
		f, ok := v.(float64)
		if !ok || f != float64(int64(f)) {
			return fmt.Errorf("%s: %v is not an integer", at, v)
		}
		if m, ok := s["minimum"].(float64); ok && f < m {
			return fmt.Errorf("%s: %v is below %v", at, v, m)
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			return fmt.Errorf("%s: %v is not a boolean", at, v)
		}
	}
	return nil
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}

// What the Go code encodes is valid under the contract: the golden
// encodings of pkg/schema (an event of every kind, filters, outcomes,
// transport messages), and a frame of every op with the members it carries.
func TestGoCodeOutputValidatesAgainstTheContract(t *testing.T) {
	defs := readEvents(t)
	check := func(what, def string, b []byte) {
		t.Helper()
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if err := validate(defs, map[string]any{"$ref": "#/$defs/" + def}, v, what); err != nil {
			t.Error(err)
		}
	}
	golden, _ := filepath.Glob("../pkg/schema/testdata/golden/*.json")
	seen := map[string]bool{}
	for _, path := range golden {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(path)
		switch {
		case strings.HasPrefix(name, "filter-"):
			check(name, "EventFilter", b)
		case strings.HasPrefix(name, "outcome-"):
			check(name, "Outcome", b)
		case strings.HasPrefix(name, "transport-"):
			check(name, "TransportMessage", b)
		default:
			var ev schema.ClientEvent
			if err := ev.UnmarshalJSON(b); err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			seen[string(ev.Kind)] = true
			check(name, "ClientEvent", b)
		}
	}
	for _, k := range schema.AllKinds() {
		if !seen[string(k)] {
			t.Errorf("no golden event of kind %s to validate", k)
		}
	}
	filter := &schema.EventFilter{Kinds: []schema.EventKind{schema.KindMessageReceived}, GroupIDs: []schema.Bytes{{0xab}},
		ContentTypes: []schema.ContentTypeID{{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1}}, ReferencesOwnMessages: true}
	lagged := wire.AppendLagged(wire.JSON, nil, 3)
	for _, f := range []wire.Frame{
		{Op: wire.OpConnect, Token: "eyJ"},
		{Op: wire.OpConnected},
		{Op: wire.OpSubscribe, ID: 1, ClientID: "abab", Filter: filter, AfterSeq: 9, Held: 2},
		{Op: wire.OpSubscribe, ID: 2, ClientID: "abab", Filter: filter, StartTime: 1700000000000, FromStart: true},
		{Op: wire.OpCredit, Sub: 1, N: 5},
		{Op: wire.OpUnsubscribe, Sub: 1},
		{Op: wire.OpSubscribed, ID: 1, Sub: 1, Seq: 41},
		{Op: wire.OpEvent, Sub: 1, Event: lagged, AtMost: true},
		{Op: wire.OpEnded, Sub: 1, Reason: wire.ReasonTokenExpired},
		{Op: wire.OpError, ID: 2, Code: wire.CodeForbidden, Message: "token does not name this client"},
	} {
		check("frame "+f.Op, "Frame", wire.Append(wire.JSON, nil, &f))
	}
}

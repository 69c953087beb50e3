package auth

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// Lifetimes is the longest a token may still be valid when it is
// presented, per scope. A token's limit is the smallest among its scopes;
// a scope not in the table, or no scope, gets the smallest of the table.
type Lifetimes map[Scope]time.Duration

// DefaultLifetimes: a week for admin tokens (operator tools), 30 days for
// the scopes services and apps hold.
var DefaultLifetimes = Lifetimes{
	ScopeAdmin:   7 * 24 * time.Hour,
	ScopeIngest:  30 * 24 * time.Hour,
	ScopeEvents:  30 * 24 * time.Hour,
	ScopeSignals: 30 * 24 * time.Hour,
	ScopeRead:    30 * 24 * time.Hour,
	ScopeSend:    30 * 24 * time.Hour,
}

// Limit returns the longest a token with scopes may still be valid when
// presented, and the scope that sets it: what a minter checks so the roles
// do not refuse its token.
func (l Lifetimes) Limit(scopes []Scope) (Scope, time.Duration) { return l.limit(scopes) }

// limit returns the scope that sets the lifetime limit of a token with
// scopes, and the limit.
func (l Lifetimes) limit(scopes []Scope) (Scope, time.Duration) {
	scope, limit := Scope(""), time.Duration(math.MaxInt64)
	consider := func(s Scope, d time.Duration) {
		if d < limit || (d == limit && s < scope) {
			scope, limit = s, d
		}
	}
	whole := len(scopes) == 0
	for _, s := range scopes {
		if d, ok := l[s]; ok {
			consider(s, d)
		} else {
			whole = true
		}
	}
	if whole {
		for s, d := range l {
			consider(s, d)
		}
	}
	return scope, limit
}

// String is the flag form, scope=duration pairs in scope order.
func (l Lifetimes) String() string {
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(l)) {
		parts = append(parts, string(s)+"="+l[s].String())
	}
	return strings.Join(parts, ",")
}

// Set merges the flag form into l, so scopes it leaves out keep their
// value; it makes *Lifetimes a flag.Value.
func (l *Lifetimes) Set(s string) error {
	parsed, err := ParseLifetimes(s)
	if err != nil {
		return err
	}
	if *l == nil {
		*l = Lifetimes{}
	}
	maps.Copy(*l, parsed)
	return nil
}

// ParseLifetimes reads the flag form: comma-separated scope=duration pairs
// (admin=24h,events=168h) for known scopes, each duration positive.
func ParseLifetimes(s string) (Lifetimes, error) {
	l := Lifetimes{}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, dur, ok := strings.Cut(part, "=")
		scope := Scope(strings.TrimSpace(name))
		if !ok {
			return nil, fmt.Errorf("%q: want scope=duration", part)
		}
		if _, known := DefaultLifetimes[scope]; !known {
			return nil, fmt.Errorf("%q: unknown scope", name)
		}
		d, err := time.ParseDuration(strings.TrimSpace(dur))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("%q: want a positive duration like 24h", dur)
		}
		l[scope] = d
	}
	return l, nil
}

// claimsError is a claim set that does not parse strictly.
type claimsError struct{ reason string }

func (e *claimsError) Error() string { return "token claims: " + e.reason }

func badClaim(format string, args ...any) error {
	return &claimsError{reason: fmt.Sprintf(format, args...)}
}

// UnmarshalJSON reads the claim set strictly: one JSON object, no member
// twice (encoding/json would keep the last, so two issuers' parsers could
// read different tenants), and each claim the fabric reads of its one type
// (encoding/json and jwt.NumericDate take a quoted number for exp). Claims
// the fabric does not read are skipped.
func (c *tokenClaims) UnmarshalJSON(b []byte) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return badClaim("want a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return badClaim("malformed JSON")
		}
		name, _ := t.(string)
		if seen[name] {
			return badClaim("%s appears twice", quoteClaim(name))
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return badClaim("malformed JSON")
		}
		if err := c.claim(name, raw); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return badClaim("malformed JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return badClaim("trailing data after the object")
	}
	return nil
}

// claim reads one member of the claim set.
func (c *tokenClaims) claim(name string, raw json.RawMessage) error {
	var err error
	switch name {
	case "tenant":
		c.Tenant, err = claimString(raw)
	case "scopes":
		var ss []string
		ss, err = claimStrings(raw)
		c.Scopes = make([]Scope, len(ss))
		for i, s := range ss {
			c.Scopes[i] = Scope(s)
		}
	case "clients":
		c.Clients, err = claimStrings(raw)
	case "minted":
		c.Minted, err = claimBool(raw)
	case "exp":
		c.ExpiresAt, err = claimTime(raw)
	case "nbf":
		c.NotBefore, err = claimTime(raw)
	case "iat":
		c.IssuedAt, err = claimTime(raw)
	case "iss":
		c.Issuer, err = claimString(raw)
	case "sub":
		c.Subject, err = claimString(raw)
	case "jti":
		c.ID, err = claimString(raw)
	case "aud":
		if s, serr := claimString(raw); serr == nil {
			c.Audience = jwt.ClaimStrings{s}
		} else {
			c.Audience, err = claimStrings(raw)
		}
	default:
		return nil
	}
	if err != nil {
		return badClaim("%s: %v", name, err)
	}
	return nil
}

var (
	errWantString  = errors.New("want a string")
	errWantStrings = errors.New("want an array of strings")
	errWantTime    = errors.New("want a number of seconds since 1970")
	errWantBool    = errors.New("want true or false")
)

func claimString(raw json.RawMessage) (string, error) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", errWantString
	}
	return s, nil
}

func claimStrings(raw json.RawMessage) ([]string, error) {
	var items []json.RawMessage
	if len(raw) == 0 || raw[0] != '[' || json.Unmarshal(raw, &items) != nil {
		return nil, errWantStrings
	}
	out := make([]string, len(items))
	for i, it := range items {
		s, err := claimString(it)
		if err != nil {
			return nil, errWantStrings
		}
		out[i] = s
	}
	return out, nil
}

func claimBool(raw json.RawMessage) (bool, error) {
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, errWantBool
}

// claimTime reads a NumericDate (RFC 7519 §2): a JSON number, never a
// string.
func claimTime(raw json.RawMessage) (*jwt.NumericDate, error) {
	if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		return nil, errWantTime
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	// Beyond ±2^53 seconds a time is neither exact nor meaningful.
	if err != nil || math.Abs(f) > 1<<53 {
		return nil, errWantTime
	}
	sec, frac := math.Modf(f)
	return jwt.NewNumericDate(time.Unix(int64(sec), int64(frac*1e9))), nil
}

// quoteClaim quotes a claim name, cut short.
func quoteClaim(name string) string {
	const limit = 40
	if len(name) > limit {
		return strconv.QuoteToASCII(name[:limit]) + "…"
	}
	return strconv.QuoteToASCII(name)
}

package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Drift is one field of an existing stream or bucket that differs from the
// configuration the fabric expects.
type Drift struct {
	// Name is the stream or bucket.
	Name string
	// Field is the configuration field, as named in jetstream.StreamConfig.
	Field string
	// Want and Got are the expected and the found value.
	Want, Got string
}

// DriftError reports existing streams or buckets whose configuration
// differs from the expected one. Ensure neither runs with them silently nor
// overwrites them: an operator decides.
type DriftError struct {
	Drifts []Drift
}

func (e *DriftError) Error() string {
	var b strings.Builder
	b.WriteString("streams: configuration drift:")
	for i, d := range e.Drifts {
		if i > 0 {
			b.WriteByte(';')
		}
		fmt.Fprintf(&b, " %s %s want %s got %s", d.Name, d.Field, d.Want, d.Got)
	}
	return b.String()
}

// Ensure provisions every stream and KV bucket of the fabric. It creates
// what is missing and leaves what matches cfg. When an existing stream or
// bucket differs, it still provisions the rest and then returns a
// *DriftError listing every differing field.
//
// A cluster that is forming or loaded answers some requests with errors
// that pass: no placement peers yet (a node's statistics have not reached
// the meta leader), or a request that timed out. Ensure retries those for
// up to a minute (settleTime) while ctx lasts; a create that timed out but
// was made is found as existing on the retry.
func Ensure(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	ctx, cancel := context.WithTimeout(ctx, settleTime)
	defer cancel()
	var drifts []Drift
	for _, sc := range StreamConfigs(cfg) {
		d, err := ensureStream(ctx, js, sc)
		if err != nil {
			return err
		}
		drifts = append(drifts, d...)
	}
	for _, kc := range BucketConfigs(cfg) {
		d, err := ensureBucket(ctx, js, kc)
		if err != nil {
			return err
		}
		drifts = append(drifts, d...)
	}
	if len(drifts) > 0 {
		return &DriftError{Drifts: drifts}
	}
	return nil
}

// settleTime bounds how long Ensure retries errors that pass.
const settleTime = time.Minute

// jsErrNoPlacementPeers is JetStream's "no suitable peers for placement"
// (nats.go has no name for it).
const jsErrNoPlacementPeers jetstream.ErrorCode = 10005

// settling calls f until it returns an error that does not pass, or ctx
// ends.
func settling[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	delay := 50 * time.Millisecond
	for {
		// Each attempt gets its own request timeout, so one that timed out
		// leaves time for the next.
		actx, cancel := context.WithTimeout(ctx, 5*time.Second)
		v, err := f(actx)
		cancel()
		var apiErr *jetstream.APIError
		passes := errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrNoPlacementPeers ||
			errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
		if err == nil || !passes || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) ([]Drift, error) {
	s, err := settling(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, want.Name) })
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = settling(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.CreateStream(ctx, want) })
		// Another process may create it between the lookup and the create;
		// then compare with what it made.
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = settling(ctx, func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, want.Name) })
		}
		if err != nil {
			return nil, fmt.Errorf("streams: create %s: %w", want.Name, err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("streams: look up %s: %w", want.Name, err)
	}
	return streamDrift(want.Name, want, s.CachedInfo().Config), nil
}

func ensureBucket(ctx context.Context, js jetstream.JetStream, want jetstream.KeyValueConfig) ([]Drift, error) {
	name := KVStream(want.Bucket)
	lookup := func(ctx context.Context) (jetstream.Stream, error) { return js.Stream(ctx, name) }
	s, err := settling(ctx, lookup)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = settling(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return js.CreateKeyValue(ctx, want) })
		if err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return nil, fmt.Errorf("streams: create bucket %s: %w", want.Bucket, err)
		}
		s, err = settling(ctx, lookup)
	}
	if err != nil {
		return nil, fmt.Errorf("streams: look up bucket %s: %w", want.Bucket, err)
	}
	return bucketDrift(want, s.CachedInfo().Config), nil
}

type differ struct {
	name   string
	drifts []Drift
}

func (d *differ) check(field string, want, got any) {
	w, g := fmt.Sprint(want), fmt.Sprint(got)
	if w != g {
		d.drifts = append(d.drifts, Drift{Name: d.name, Field: field, Want: w, Got: g})
	}
}

// streamDrift compares the fields the fabric sets; fields it leaves to the
// server are not compared.
func streamDrift(name string, want, got jetstream.StreamConfig) []Drift {
	d := &differ{name: name}
	d.check("Subjects", sorted(want.Subjects), sorted(got.Subjects))
	d.check("SubjectTransform", transformString(want.SubjectTransform), transformString(got.SubjectTransform))
	d.check("RePublish", republishString(want.RePublish), republishString(got.RePublish))
	d.check("Retention", want.Retention, got.Retention)
	d.check("Discard", want.Discard, got.Discard)
	d.check("Storage", want.Storage, got.Storage)
	d.check("Replicas", want.Replicas, got.Replicas)
	d.check("MaxAge", want.MaxAge, got.MaxAge)
	d.check("Duplicates", want.Duplicates, got.Duplicates)
	d.check("MaxMsgs", want.MaxMsgs, got.MaxMsgs)
	d.check("MaxBytes", want.MaxBytes, got.MaxBytes)
	d.check("MaxMsgsPerSubject", want.MaxMsgsPerSubject, got.MaxMsgsPerSubject)
	d.check("AllowDirect", want.AllowDirect, got.AllowDirect)
	d.check("AllowAtomicPublish", want.AllowAtomicPublish, got.AllowAtomicPublish)
	d.check("AllowMsgTTL", want.AllowMsgTTL, got.AllowMsgTTL)
	d.check("AllowRollup", want.AllowRollup, got.AllowRollup)
	d.check("DenyDelete", want.DenyDelete, got.DenyDelete)
	d.check("DenyPurge", want.DenyPurge, got.DenyPurge)
	return d.drifts
}

// bucketDrift compares a bucket's stream with the KV configuration it was
// made from, using the mapping nats.go applies when creating a bucket.
func bucketDrift(want jetstream.KeyValueConfig, got jetstream.StreamConfig) []Drift {
	d := &differ{name: want.Bucket}
	d.check("History", int64(want.History), got.MaxMsgsPerSubject)
	d.check("TTL", want.TTL, got.MaxAge)
	d.check("Storage", want.Storage, got.Storage)
	d.check("Replicas", want.Replicas, got.Replicas)
	d.check("LimitMarkerTTL", want.LimitMarkerTTL, got.SubjectDeleteMarkerTTL)
	d.check("AllowMsgTTL", want.LimitMarkerTTL > 0, got.AllowMsgTTL)
	d.check("Subjects", []string{KVSubject(want.Bucket, ">")}, got.Subjects)
	return d.drifts
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

func transformString(t *jetstream.SubjectTransformConfig) string {
	if t == nil {
		return "none"
	}
	return t.Source + " -> " + t.Destination
}

func republishString(r *jetstream.RePublish) string {
	if r == nil {
		return "none"
	}
	return fmt.Sprintf("%s -> %s headers-only=%t", r.Source, r.Destination, r.HeadersOnly)
}

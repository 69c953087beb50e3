package streams

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/subject"
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
func Ensure(ctx context.Context, js jetstream.JetStream, cfg Config) error {
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

func ensureStream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) ([]Drift, error) {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		// Another process may create it between the lookup and the create;
		// then compare with what it made.
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			s, err = js.Stream(ctx, want.Name)
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
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateKeyValue(ctx, want)
		if err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return nil, fmt.Errorf("streams: create bucket %s: %w", want.Bucket, err)
		}
		s, err = js.Stream(ctx, name)
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

// PruneCheckpoint purges every checkpoint of a group but the newest.
// Checkpoints never expire (see the package doc), so converge calls this
// after a committed batch to keep FABRIC_EVENTS bounded.
func PruneCheckpoint(ctx context.Context, js jetstream.JetStream, tenant, groupHex string) error {
	subj, err := subject.Checkpoint(tenant, groupHex)
	if err != nil {
		return err
	}
	s, err := js.Stream(ctx, StreamEvents)
	if err != nil {
		return fmt.Errorf("streams: prune checkpoint: %w", err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(subj), jetstream.WithPurgeKeep(1)); err != nil {
		return fmt.Errorf("streams: prune checkpoint: %w", err)
	}
	return nil
}

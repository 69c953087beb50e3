// Package streams names and provisions the JetStream streams and KV buckets
// the fabric runs on (docs/architecture.md, "Streams, subjects and
// buckets"). Ensure creates what is missing, accepts what matches and
// reports, never overwrites, what differs.
//
// # Checkpoints and retention
//
// FABRIC_EVENTS holds both the client events, which expire after
// Config.EventsMaxAge, and converge's checkpoints on fabric.ck.>, which must
// never expire: a checkpoint is the fence of converge's atomic batches, and
// atomic batches are per stream, so checkpoints cannot live elsewhere. The
// stream therefore allows per-message TTLs and every checkpoint is published
// with the header Nats-TTL: never (CheckpointTTL), which exempts that message
// from MaxAge. Superseded checkpoints do not expire either; each checkpoint
// rolls up its subject (Nats-Rollup: sub), so a group keeps only its newest
// and converge needs no purge (issue 27). The
// message index of each group lives beside its checkpoint, on
// fabric.ck.<tenant>.<group>.m.<message id> and .x.<seconds>, written in
// the same batches and never expiring either (docs/converge.md).
package streams

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/subject"
)

// Stream names.
const (
	StreamInput    = "FABRIC_IN"
	StreamEvents   = "FABRIC_EVENTS"
	StreamOutcomes = "FABRIC_OUTCOMES"
	StreamRetained = "FABRIC_RETAINED"
)

// ConsumerOutbound is the durable consumer on FABRIC_EVENTS, filter
// fabric.out.>, through which ingest takes what the fabric's hosted
// clients send as input (issue 19). Every ingest shares it.
const ConsumerOutbound = "ingest-outbound"

// KV bucket names.
const (
	BucketClients   = "fabric-clients"
	BucketGroupKeys = "fabric-group-keys"
	BucketGroups    = "fabric-groups"
	BucketConverge  = "fabric-converge"
	BucketStores    = "fabric-stores"
)

// KVStream is the stream a KV bucket is stored in.
func KVStream(bucket string) string { return "KV_" + bucket }

// KVSubject is the stream subject of a KV bucket's key; KVSubject(bucket,
// ">") matches every key.
func KVSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// CheckpointTTL is the Nats-TTL header value every checkpoint message on
// fabric.ck.> carries, so that the stream's MaxAge never removes it.
const CheckpointTTL = "never"

// Defaults applied by Config for zero fields.
const (
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultEventsMaxAge    = 24 * time.Hour
	DefaultInputMaxAge     = 7 * 24 * time.Hour
	DefaultOutcomesMaxAge  = 7 * 24 * time.Hour
	DefaultRetainedMaxAge  = 7 * 24 * time.Hour
	DefaultOutcomeHistory  = 4
	// DefaultInputMaxBytes bounds FABRIC_IN: past it a publish is refused
	// (discard new), never old input dropped.
	DefaultInputMaxBytes = 10 << 30
	// DefaultTenantInputBytes bounds what one tenant stores on FABRIC_IN
	// through one process within its MaxAge (quota.Tally): a tenth of
	// DefaultInputMaxBytes.
	DefaultTenantInputBytes = DefaultInputMaxBytes / 10
	// DefaultLimitMarkerTTL is how long a delete marker left by an expired
	// per-key TTL stays in fabric-converge and fabric-stores, so watchers
	// see the key go.
	DefaultLimitMarkerTTL = time.Minute
)

// Config sets what may differ between deployments. The zero value is the
// single-node all-in-one configuration.
type Config struct {
	// Replicas of every stream and bucket: 1 (default) or 3 in production.
	Replicas int
	// Storage of every stream and bucket; the zero value is file storage.
	Storage jetstream.StorageType
	// DuplicateWindow is the Nats-Msg-Id dedup window of the streams.
	DuplicateWindow time.Duration
	// EventsMaxAge is how long client events stay in FABRIC_EVENTS;
	// checkpoints stay regardless (see the package doc).
	EventsMaxAge time.Duration
	// InputMaxAge, OutcomesMaxAge and RetainedMaxAge bound how long input,
	// outcome records and retained objects are kept. Negative means no limit.
	InputMaxAge    time.Duration
	OutcomesMaxAge time.Duration
	RetainedMaxAge time.Duration
	// InputMaxBytes bounds FABRIC_IN's size; a publish past it is refused
	// with "maximum bytes exceeded" and nothing stored is dropped.
	// DefaultInputMaxBytes when 0, no bound when negative.
	InputMaxBytes int64
	// OutcomeHistory is how many records are kept per outcome subject; the
	// last is the current outcome.
	OutcomeHistory int64
}

func (c Config) withDefaults() Config {
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
	}
	c.EventsMaxAge = ageDefault(c.EventsMaxAge, DefaultEventsMaxAge)
	c.InputMaxAge = ageDefault(c.InputMaxAge, DefaultInputMaxAge)
	c.OutcomesMaxAge = ageDefault(c.OutcomesMaxAge, DefaultOutcomesMaxAge)
	c.RetainedMaxAge = ageDefault(c.RetainedMaxAge, DefaultRetainedMaxAge)
	switch {
	case c.InputMaxBytes == 0:
		c.InputMaxBytes = DefaultInputMaxBytes
	case c.InputMaxBytes < 0:
		c.InputMaxBytes = -1
	}
	if c.OutcomeHistory == 0 {
		c.OutcomeHistory = DefaultOutcomeHistory
	}
	return c
}

func ageDefault(v, def time.Duration) time.Duration {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return v
}

// dedupWindow is the duplicate window for a stream with maxAge: the server
// refuses a window longer than MaxAge.
func (c Config) dedupWindow(maxAge time.Duration) time.Duration {
	if maxAge > 0 && c.DuplicateWindow > maxAge {
		return maxAge
	}
	return c.DuplicateWindow
}

// InputMaxAge reads how long FABRIC_IN keeps input, the window a tenant's
// input bytes are counted in (quota.Tally); 0 when it keeps input for
// ever.
func InputMaxAge(ctx context.Context, js jetstream.JetStream) (time.Duration, error) {
	s, err := js.Stream(ctx, StreamInput)
	if err != nil {
		return 0, fmt.Errorf("stream %s: %w", StreamInput, err)
	}
	return s.CachedInfo().Config.MaxAge, nil
}

// StreamConfigs returns the configuration of every stream, as Ensure
// creates them.
func StreamConfigs(cfg Config) []jetstream.StreamConfig {
	c := cfg.withDefaults()
	base := func(name string, maxAge time.Duration, subjects ...string) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name:              name,
			Subjects:          subjects,
			Retention:         jetstream.LimitsPolicy,
			Discard:           jetstream.DiscardOld,
			MaxMsgs:           -1,
			MaxBytes:          -1,
			MaxMsgsPerSubject: -1,
			MaxAge:            maxAge,
			Duplicates:        c.dedupWindow(maxAge),
			Storage:           c.Storage,
			Replicas:          c.Replicas,
		}
	}

	in := base(StreamInput, c.InputMaxAge, subject.InputPattern)
	in.Description = "Group input, ordered per group, stored under 64 partitions."
	// Input not yet converged must never be dropped to make room.
	in.MaxBytes = c.InputMaxBytes
	in.Discard = jetstream.DiscardNew
	in.SubjectTransform = &jetstream.SubjectTransformConfig{
		Source:      subject.InputPattern,
		Destination: subject.InputTransform,
	}

	// Outbound messages and operation records share the stream with the
	// checkpoint: converge stores them in the fenced batch of the
	// transaction that made them (issue 19, exactly once).
	ev := base(StreamEvents, c.EventsMaxAge, subject.EventsPattern, subject.CheckpointPattern, subject.OutboundPattern, subject.OperationPattern)
	ev.Description = "Client events, republished live, converge checkpoints, outbound messages and operation records."
	ev.RePublish = &jetstream.RePublish{
		Source:      subject.EventsPattern,
		Destination: subject.LiveTransform,
	}
	ev.AllowDirect = true
	ev.AllowAtomicPublish = true
	ev.AllowMsgTTL = true
	// Converge's message index replaces an entry by a rollup of its
	// subject, in the atomic batch of its transaction.
	ev.AllowRollup = true

	oc := base(StreamOutcomes, c.OutcomesMaxAge, subject.OutcomePattern)
	oc.Description = "Outcome records, the last per subject current."
	oc.MaxMsgsPerSubject = c.OutcomeHistory
	oc.AllowDirect = true

	rt := base(StreamRetained, c.RetainedMaxAge, subject.RetainedPattern)
	rt.Description = "Transport-deferred and unknown-group objects."
	rt.AllowDirect = true

	return []jetstream.StreamConfig{in, ev, oc, rt}
}

// BucketConfigs returns the configuration of every KV bucket, as Ensure
// creates them.
func BucketConfigs(cfg Config) []jetstream.KeyValueConfig {
	c := cfg.withDefaults()
	kv := func(name, desc string) jetstream.KeyValueConfig {
		return jetstream.KeyValueConfig{
			Bucket:      name,
			Description: desc,
			History:     1,
			Storage:     c.Storage,
			Replicas:    c.Replicas,
		}
	}
	clients := kv(BucketClients, "Hosted client records, private keys sealed.")
	groupKeys := kv(BucketGroupKeys, "Candidate group event keys.")
	groups := kv(BucketGroups, "Hosted members of each group and DM conversation keys.")
	conv := kv(BucketConverge, "Converge state per group and partition leases.")
	// Leases expire by per-key TTL.
	conv.LimitMarkerTTL = DefaultLimitMarkerTTL
	stores := kv(BucketStores, "Consent, HMAC keys, identity association states, signal idempotency keys.")
	// Signal idempotency keys expire by per-key TTL.
	stores.LimitMarkerTTL = DefaultLimitMarkerTTL
	return []jetstream.KeyValueConfig{clients, groupKeys, groups, conv, stores}
}

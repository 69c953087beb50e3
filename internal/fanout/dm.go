package fanout

import (
	"context"
	"encoding/hex"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
)

// DMResolver resolves a group id to the conversation key of the stitched DM
// the group belongs to (DMS-009), so a filter naming one group of a DM
// selects the events of all of them (EVENT-020). ok is false for a group that
// is no DM's or is unknown. It is asked when a subscription starts; a group
// stitched later is learnt by the tap from the client's events (tap.learn).
type DMResolver interface {
	DMKey(ctx context.Context, tenant string, groupID []byte) (key []byte, ok bool, err error)
}

// KVDMKeys reads DM conversation keys from the fabric-groups bucket, key
// <tenant>.<group hex>: a group record's (bus.GroupRecord)
// DMConversationKey, absent for a group that is not a DM's. Reads are
// direct gets of one key, so the gateway needs no bucket lookup and creates
// nothing.
type KVDMKeys struct {
	JetStream jetstream.JetStream
	Bucket    string        // streams.BucketGroups when empty
	Timeout   time.Duration // per read
}

// DMKey implements DMResolver.
func (k *KVDMKeys) DMKey(ctx context.Context, tenant string, groupID []byte) ([]byte, bool, error) {
	bucket := k.Bucket
	if bucket == "" {
		bucket = streams.BucketGroups
	}
	key, err := subject.GroupKey(tenant, hex.EncodeToString(groupID))
	if err != nil {
		return nil, false, err
	}
	if k.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, k.Timeout)
		defer cancel()
	}
	v, ok, err := bus.KVGet(ctx, k.JetStream, bucket, key)
	if err != nil || !ok {
		return nil, false, err
	}
	dmKey, err := bus.RecordConversationKey(v)
	if err != nil || dmKey == nil {
		return nil, false, err
	}
	return dmKey, true, nil
}

// resolvedDMKeys is the filter's view of the keys resolved at subscribe time.
type resolvedDMKeys map[string][]byte

func (r resolvedDMKeys) DMKeys(groupID []byte) ([]byte, bool) {
	k, ok := r[string(groupID)]
	return k, ok
}

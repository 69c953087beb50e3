package fanout

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

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
// <tenant>.<group hex>. The record is the msgpack map converge writes
// (bus.GroupRecord); its member dm_conversation_key (bin) is the key,
// absent for a group that is not a DM's. Other members are ignored. Reads are direct gets, so the gateway
// needs no JetStream context and creates nothing.
type KVDMKeys struct {
	NATS    *nats.Conn
	Bucket  string        // streams.BucketGroups when empty
	Timeout time.Duration // per read
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
	m, err := k.NATS.RequestWithContext(ctx, "$JS.API.DIRECT.GET.KV_"+bucket+".$KV."+bucket+"."+key, nil)
	if err != nil {
		return nil, false, fmt.Errorf("read group record: %w", err)
	}
	switch st := m.Header.Get(headerStatus); st {
	case "":
	case "404":
		return nil, false, nil
	default:
		return nil, false, fmt.Errorf("read group record: status %s", st)
	}
	if op := m.Header.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
		return nil, false, nil
	}
	dmKey, err := bus.RecordConversationKey(m.Data)
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

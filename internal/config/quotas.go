package config

import (
	"context"
	"flag"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/clientapi"
	"github.com/fabric-mls/fabric/internal/operations"
	"github.com/fabric-mls/fabric/internal/quota"
	"github.com/fabric-mls/fabric/internal/read"
)

// Quotas are the per-tenant quota flags of the client API and of input,
// as the roles that serve them (ingest, fabric run) take them
// (docs/limits.md).
type Quotas struct {
	opRate, opBurst, opByteRate       int
	readRate, readBurst, readByteRate int
	readPageBytes, readInFlight       int
	tenantInputBytes                  int
}

// RegisterFlags registers -op-rate, -op-burst, -op-byte-rate, -read-rate,
// -read-burst, -read-byte-rate, -read-page-bytes, -read-inflight-bytes and
// -tenant-input-bytes.
func (q *Quotas) RegisterFlags(fs *flag.FlagSet, errs *Errs) {
	Int(fs, errs, &q.opRate, "op-rate", operations.DefaultRate, "operation requests per second per tenant (records read included); past it 429 rate_limited; -1 turns it off")
	Int(fs, errs, &q.opBurst, "op-burst", 0, "token bucket size of -op-rate; 0 is twice the rate")
	Int(fs, errs, &q.opByteRate, "op-byte-rate", operations.DefaultByteRate, "stored operation bytes per second per tenant; past it 429 byte_rate_limited; -1 turns it off")
	Int(fs, errs, &q.readRate, "read-rate", read.DefaultRate, "read API requests per second per tenant; past it 429 rate_limited; -1 turns it off")
	Int(fs, errs, &q.readBurst, "read-burst", 0, "token bucket size of -read-rate; 0 is twice the rate")
	Int(fs, errs, &q.readByteRate, "read-byte-rate", read.DefaultByteRate, "read API answer bytes per second per tenant; past it 429 byte_rate_limited; -1 turns it off")
	Int(fs, errs, &q.readPageBytes, "read-page-bytes", read.DefaultPageBytes, "bytes of one page of messages; the page ends early with its cursor")
	Int(fs, errs, &q.readInFlight, "read-inflight-bytes", read.DefaultInFlightBytes, "bytes of stored records one tenant's reads hold at once; a page past it ends early, one with nothing yet is 429 reads_in_flight; -1 turns it off")
	Int(fs, errs, &q.tenantInputBytes, "tenant-input-bytes", streams.DefaultTenantInputBytes, "bytes one tenant may store on FABRIC_IN through this process within the stream's MaxAge (input and operations); past it 429 input_quota_exceeded; -1 turns it off")
}

// Validate reports values that are neither a bound nor -1.
func (q Quotas) Validate(errs *Errs) {
	for _, v := range []struct {
		name string
		n    int
	}{{"-op-rate", q.opRate}, {"-op-byte-rate", q.opByteRate}, {"-read-rate", q.readRate}, {"-read-byte-rate", q.readByteRate}, {"-read-inflight-bytes", q.readInFlight}, {"-tenant-input-bytes", q.tenantInputBytes}} {
		if v.n == 0 || v.n < -1 {
			errs.Addf("%s: %d; use a positive bound or -1 for none", v.name, v.n)
		}
	}
	if q.opBurst < 0 || q.readBurst < 0 {
		errs.Addf("-op-burst, -read-burst: must not be negative")
	}
	if q.readPageBytes <= 0 {
		errs.Addf("-read-page-bytes: %d; it must be positive", q.readPageBytes)
	}
}

// TenantInput is the tally of each tenant's bytes on FABRIC_IN, over the
// stream's MaxAge; nil with -tenant-input-bytes -1.
func (q Quotas) TenantInput(ctx context.Context, js jetstream.JetStream) (*quota.Tally, error) {
	if q.tenantInputBytes < 0 {
		return nil, nil
	}
	window, err := streams.InputMaxAge(ctx, js)
	if err != nil {
		return nil, fmt.Errorf("-tenant-input-bytes: %w", err)
	}
	return quota.NewTally(int64(q.tenantInputBytes), window), nil
}

// TenantInputBytes is -tenant-input-bytes: -1 for none.
func (q Quotas) TenantInputBytes() int64 { return int64(q.tenantInputBytes) }

// ClientAPI is the client API's quotas, operations counting their bytes
// on FABRIC_IN in input.
func (q Quotas) ClientAPI(input *quota.Tally) clientapi.Quotas {
	return clientapi.Quotas{
		Operations: operations.Quotas{Rate: float64(q.opRate), Burst: q.opBurst, ByteRate: float64(q.opByteRate), InputBytes: input},
		Read:       read.Quotas{Rate: float64(q.readRate), Burst: q.readBurst, ByteRate: float64(q.readByteRate), PageBytes: q.readPageBytes, InFlightBytes: int64(q.readInFlight)},
	}
}

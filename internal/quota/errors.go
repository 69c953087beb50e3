package quota

import "github.com/fabric-mls/fabric/internal/refusal"

// The refusals of a tenant past a quota: 429 with Retry-After on every
// front (docs/limits.md), never a 5xx. Each code is a label value of the
// fronts' refusal metrics.
var (
	// ErrRateLimited refuses a tenant past its request (or message) rate,
	// with the time until its bucket allows the request.
	ErrRateLimited = refusal.New(refusal.RateLimited, "rate_limited", "tenant over its request rate")
	// ErrByteRateLimited refuses a tenant past its byte rate.
	ErrByteRateLimited = refusal.New(refusal.RateLimited, "byte_rate_limited", "tenant over its byte rate")
	// ErrInputQuota refuses input of a tenant whose bytes stored on the
	// input stream within its retention are at their bound (Tally), with
	// the time until enough has aged out.
	ErrInputQuota = refusal.New(refusal.RateLimited, "input_quota_exceeded", "the tenant's input stored within the input stream's retention is at its bound")
)

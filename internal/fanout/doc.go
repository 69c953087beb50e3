// Package fanout is the gateway apps connect to for live client events
// (DESIGN §7): WebSocket and Server-Sent Events, subscriptions with an
// EventFilter, a bounded queue per subscription, and taps on the event
// stream's republished subjects with gap repair.
//
// # Where events come from
//
// One core NATS subscription (a tap) on fabric.live.<tenant>.<client> serves
// every subscription of that client on this gateway: it is created with the
// first and removed with the last, and nothing else changes upstream
// (EVENT-013): no stream, no consumer. Each event is decoded once, filtered
// per subscription (EVENT-020 to 022), and encoded once per encoding; the
// bytes are shared by every subscription it is handed to.
//
// The tap tracks the last stream sequence it handed off. A republished
// event whose Nats-Last-Sequence is above it reveals a gap (republishing is
// at most once); the missing events are read from FABRIC_EVENTS with batched
// direct gets and handed off first, in order (EVENT-015). After the gateway's
// NATS connection reconnects every tap is compared with the stream the same
// way. Past the repair's limit the missing events are read only to be
// counted: each subscription's lagged counts those its filter selects
// (EVENT-031). An event that cannot be obtained or decoded is reported as a
// discard too, an upper bound marked at_most (docs/wire-formats.md), so the
// app gets a lagged event instead of a silent hole.
//
// # Subscriptions
//
// A subscription is registered with its tap before the subscribed frame (or
// the SSE ": subscribed" comment) is written, and is offered only events
// stored after the client's last stored event at that moment (EVENT-014),
// even when the tap is running and has not seen every stored event yet. Its queue holds at most 1024
// events counted end to end: queued here, sent and not yet credited back by
// the SDK (EVENT-030). Past the bound new events are discarded and counted;
// one lagged event carrying the count precedes any later event (EVENT-031).
// Each connection has its own writer goroutine, taking one event per ready
// subscription in turn, so no subscription or connection waits for another
// (EVENT-033); the frames it takes at once leave in one write. A connection
// that does not read for the write timeout is closed.
//
// The WebSocket protocol is package wire's. A subscribe frame may carry
// after_seq and held to resume a subscription after a reconnect: the events
// stored after after_seq are replayed from the stream before live ones, and
// held counts the events the SDK still holds against the bound. SSE events
// carry the stream sequence as their id, so an EventSource reconnecting with
// Last-Event-ID resumes the same way.
//
// # Limits and errors
//
// Error frames carry a code: malformed_frame, frame_too_large, unknown_op,
// invalid_filter, forbidden (EVENT-056: a client the token does not name),
// unknown_client (no hosted client has the id),
// too_many_subscriptions, unknown_subscription, bad_credit, unavailable,
// unauthenticated, replay_budget_exceeded (docs/wire-formats.md has the
// whole protocol). A WebSocket opened without an Authorization header (a
// browser's) authenticates with its first frame, connect {token}, within
// ConnectTimeout, or is closed with a wire Close code (4400, 4401, 4403,
// 4408, 4429) and the reason; POST connection-tokens mints the short-lived
// token a backend hands to its page. A connection ends its subscriptions with an ended frame
// whose reason is unsubscribed, shutdown (drain) or token_expired (a
// connection lives no longer than its token).
//
// # Metrics
//
// fabric_fanout_connections{transport}, _subscriptions, _taps,
// _queue_depth, _events_received_total, _events_sent_total,
// _discarded_events_total, _lagged_events_total,
// _handoff_latency_seconds (stream timestamp to frame written), _gaps_total,
// _gap_repairs_total, _replayed_events_total, _gap_unrepaired_total,
// _undecodable_events_total, _protocol_errors_total{code},
// _connect_refusals_total{code}, _connection_tokens_total. No label carries a
// tenant, client or group.
package fanout

package allinone

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"golang.org/x/crypto/bcrypt"

	"github.com/fabric-mls/fabric/internal/bus"
	"github.com/fabric-mls/fabric/internal/bus/streams"
	"github.com/fabric-mls/fabric/internal/bus/subject"
	"github.com/fabric-mls/fabric/internal/converge"
)

// The NATS users of the all-in-one, one per role. Each connects with its
// own inbox prefix, so no role can read another's replies.
const (
	UserAdmin    = "admin"    // provisions streams and buckets
	UserIngest   = "ingest"   // intake: input, outcomes, retained objects
	UserAPI      = "api"      // client registration, the client stores, signals
	UserConverge = "converge" // MLS, events, checkpoints, converge state
	UserFanout   = "fanout"   // the gateway: reads events
	UserBridge   = "bridge"   // fabric bridge: reads the outbound subjects
)

// NATSUsers are every user the embedded server knows.
var NATSUsers = []string{UserAdmin, UserIngest, UserAPI, UserConverge, UserFanout, UserBridge}

// InboxPrefix is the reply-subject prefix of user's connections.
func InboxPrefix(user string) string { return "_INBOX_" + user }

// NATSPasswordFile is where the data directory keeps user's generated
// password, for standalone roles and tools that join the all-in-one.
func NATSPasswordFile(dataDir, user string) string {
	return filepath.Join(dataDir, "nats-"+user+"-password")
}

// natsPasswordBytes is the size of a generated password (hex in the file).
const natsPasswordBytes = 24

// natsCredentials loads or generates every user's password in the data
// directory and returns the server's users (bcrypt hashes, each with its
// role's permissions) and the clear passwords the roles connect with.
func natsCredentials(dataDir string) ([]*server.User, map[string]string, error) {
	perms := rolePermissions()
	users := make([]*server.User, 0, len(NATSUsers))
	passwords := make(map[string]string, len(NATSUsers))
	for _, u := range NATSUsers {
		pw, err := loadOrGenerate(dataDir, filepath.Base(NATSPasswordFile(dataDir, u)), natsPasswordBytes)
		if err != nil {
			return nil, nil, err
		}
		clear := fmt.Sprintf("%x", pw)
		hash, err := bcrypt.GenerateFromPassword([]byte(clear), bcrypt.MinCost)
		if err != nil {
			return nil, nil, fmt.Errorf("allinone: hash the NATS password of %s: %w", u, err)
		}
		passwords[u] = clear
		users = append(users, &server.User{Username: u, Password: string(hash), Permissions: perms[u]})
	}
	return users, passwords, nil
}

// connectAs opens a connection to the embedded server as user.
func (f *Fabric) connectAs(user string) (*nats.Conn, error) {
	nc, err := f.ns.Connect(nats.Name("fabric all-in-one "+user), nats.UserInfo(user, f.natsPasswords[user]),
		nats.CustomInboxPrefix(InboxPrefix(user)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			f.opts.Logger.Error("NATS", "user", user, "err", err)
		}))
	if err != nil {
		return nil, fmt.Errorf("allinone: connect to NATS as %s: %w", user, err)
	}
	return nc, nil
}

// streamInfo lets a role bind to the streams and buckets it uses (and
// check them, as Ensure does in the standalone roles).
func streamInfo() []string {
	var s []string
	for _, c := range streams.StreamConfigs(streams.Config{}) {
		s = append(s, bus.PermStreamInfo+c.Name)
	}
	for _, c := range streams.BucketConfigs(streams.Config{}) {
		s = append(s, bus.PermStreamInfo+streams.KVStream(c.Bucket))
	}
	return s
}

// streamCreate lets admin make each of the fabric's streams and buckets by
// its name, and no other stream: a stream that exists is not made again
// (JetStream refuses a create whose configuration differs), so once
// provisioned, admin cannot make a mirror, a source or a republish of
// anything onto a subject it reads (issue 27).
func streamCreate() []string {
	var s []string
	for _, c := range streams.StreamConfigs(streams.Config{}) {
		s = append(s, bus.PermStreamCreate+c.Name)
	}
	for _, c := range streams.BucketConfigs(streams.Config{}) {
		s = append(s, bus.PermStreamCreate+streams.KVStream(c.Bucket))
	}
	return s
}

// kvGet reads a bucket's keys: by a direct get (any replica) or from the
// stream leader.
func kvGet(bucket string) []string {
	s := streams.KVStream(bucket)
	return []string{bus.PermDirectGet + s + ".>", bus.PermMsgGet + s}
}

// kvWatch lists and watches a bucket's keys: an ordered push consumer of a
// generated name, its filter the bucket's keys pinned in the create
// subject, made again (the old one deleted) when it falls behind, with
// flow control.
func kvWatch(bucket string) []string {
	s := streams.KVStream(bucket)
	return []string{bus.PermConsumerCreate + s + ".*." + streams.KVSubject(bucket, ">"), bus.PermConsumerDelete + s + ".*",
		bus.PermFlowControl + s + ".*.*"}
}

// kvRead reads, lists and watches a bucket's keys.
func kvRead(bucket string) []string { return append(kvGet(bucket), kvWatch(bucket)...) }

// kvWrite puts, creates, updates and deletes a bucket's keys.
func kvWrite(bucket string) []string { return []string{streams.KVSubject(bucket, ">")} }

// direct reads a stream's messages by subject or sequence.
func direct(stream string) []string {
	return []string{bus.PermDirectGet + stream, bus.PermDirectGet + stream + ".>"}
}

// pull lets a role read and acknowledge durable pull consumer name of
// stream: look it up, fetch, acknowledge (the v1 acknowledgement subject,
// bus.PermAck, the stream and consumer and five tokens).
func pull(stream, name string) []string {
	c := stream + "." + name
	return []string{bus.PermConsumerInfo + c, bus.PermConsumerNext + c, bus.PermAck + c + ".*.*.*.*.*"}
}

// durable lets a role make durable consumer name of stream with filter,
// pinned in the create subject (the server refuses a create whose
// configuration names another filter), and read it.
func durable(stream, name, filter string) []string {
	return append([]string{bus.PermConsumerCreate + stream + "." + name + "." + filter}, pull(stream, name)...)
}

// partitionConsumers are converge's partition consumers on FABRIC_IN, each
// by its name and filter: made, deleted and made again from a sequence
// when a partition moves (converge.Worker), read and acknowledged.
func partitionConsumers() []string {
	var s []string
	for p := range subject.Partitions {
		filter, err := subject.InputPartition(p)
		if err != nil {
			panic(err) // p is in range
		}
		name := converge.ConsumerName(p)
		s = append(s, durable(streams.StreamInput, name, filter)...)
		s = append(s, bus.PermConsumerDelete+streams.StreamInput+"."+name)
	}
	return s
}

// rolePermissions are each user's permissions: what its role's code
// publishes, requests and subscribes to, nothing else, every JetStream API
// subject naming its stream and consumer (issue 27). No role may delete,
// purge or change a stream; only admin may create them, by their names.
func rolePermissions() map[string]*server.Permissions {
	perms := func(sub []string, pub ...[]string) *server.Permissions {
		var p []string
		for _, l := range pub {
			p = append(p, l...)
		}
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: p},
			Subscribe: &server.SubjectPermission{Allow: sub},
		}
	}
	in := func(user string) []string { return []string{InboxPrefix(user) + ".>"} }
	all := streamInfo()
	// ingest takes the outbound subjects through its one durable consumer
	// on FABRIC_EVENTS (issue 19), never the events: its filter is in the
	// create subject. It makes bridges' consumers, each of one tenant's
	// outbound subjects, when they ask (bridge.Provisioner).
	ingestPerms := perms(append(in(UserIngest), subject.IntakePattern, subject.BridgeRequestPattern), all,
		[]string{subject.InputPattern, subject.OutcomePattern, subject.RetainedPattern,
			bus.PermMsgGet + streams.StreamInput, bus.PermMsgGet + streams.StreamOutcomes, bus.PermMsgGet + streams.StreamRetained,
			bus.PermMsgDelete + streams.StreamRetained},
		durable(streams.StreamEvents, streams.ConsumerOutbound, subject.OutboundAll),
		[]string{bus.PermConsumerCreate + streams.StreamEvents + ".*." + subject.OutboundPattern, bus.PermConsumerInfo + streams.StreamEvents + ".*"},
		direct(streams.StreamOutcomes), direct(streams.StreamRetained),
		kvRead(streams.BucketGroupKeys), kvRead(streams.BucketGroups))
	// Intake requests are answered on the requester's reply subject.
	ingestPerms.Response = &server.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	// The client API also takes operations (issue 19): over HTTP and as
	// NATS requests (fabric.operate.>), stored on the group's input
	// subject, their first record on fabric.op.
	apiPerms := perms(append(in(UserAPI), subject.OperateRequestPattern), all, []string{subject.EventsPattern, subject.InputPattern, subject.OperationPattern, bus.PermMsgGet + streams.StreamEvents},
		// an Idempotency-Key's stored request, compared with a retry's
		[]string{bus.PermMsgGet + streams.StreamInput},
		direct(streams.StreamEvents),
		kvRead(streams.BucketClients), kvWrite(streams.BucketClients),
		kvRead(streams.BucketStores), kvWrite(streams.BucketStores),
		// the read API pages consent and identity records, and the
		// client list the tenant's clients, by sequence
		[]string{bus.PermDirectGet + streams.KVStream(streams.BucketStores), bus.PermDirectGet + streams.KVStream(streams.BucketClients)},
		kvGet(streams.BucketGroups)) // conversation keys of store and signal events (EVENT-020)
	apiPerms.Response = &server.ResponsePermission{MaxMsgs: 1, Expires: time.Minute}
	return map[string]*server.Permissions{
		UserAdmin:  perms(in(UserAdmin), all, []string{bus.PermAPIInfo}, streamCreate()),
		UserIngest: ingestPerms,
		UserAPI:    apiPerms,
		// converge keeps checkpoints bounded by rolling up their subject
		// as it writes them: it purges nothing.
		UserConverge: perms(in(UserConverge), all,
			[]string{subject.EventsPattern, subject.CheckpointPattern, subject.OutcomePattern, subject.OutboundPattern, subject.OperationPattern,
				bus.PermMsgGet + streams.StreamEvents},
			partitionConsumers(),
			direct(streams.StreamEvents), direct(streams.StreamOutcomes),
			kvRead(streams.BucketConverge), kvWrite(streams.BucketConverge),
			kvGet(streams.BucketGroups), kvWrite(streams.BucketGroups),
			kvGet(streams.BucketGroupKeys), kvWrite(streams.BucketGroupKeys),
			kvGet(streams.BucketClients), kvWrite(streams.BucketClients)),
		UserFanout: perms(append(in(UserFanout), subject.LivePattern), all,
			direct(streams.StreamEvents), kvGet(streams.BucketGroups),
			// whether a client exists: its record only (<tenant>.<client>),
			// whose private parts the gateway cannot unseal; a record a
			// replica does not hold yet is asked of the leader (R3)
			[]string{bus.PermDirectGet + streams.KVStream(streams.BucketClients) + "." + streams.KVSubject(streams.BucketClients, "*.*"),
				bus.PermMsgGet + streams.KVStream(streams.BucketClients)}),
		UserBridge: bridgePermissions(in(UserBridge), streams.ConsumerOutbound),
	}
}

// bridgePermissions let fabric bridge (internal/bridge) ask ingest for its
// durable consumers on FABRIC_EVENTS, each of one tenant's outbound
// subjects (bridge.Provisioner makes them), and read and acknowledge them;
// never make a consumer (a push consumer would deliver anywhere), never
// ingest's consumer, never the events.
func bridgePermissions(inbox []string, ingestOutbound string) *server.Permissions {
	return &server.Permissions{
		Publish: &server.SubjectPermission{
			Allow: append([]string{subject.BridgeRequestPattern}, pull(streams.StreamEvents, "*")...),
			Deny:  append([]string{"fabric.bridge.*." + ingestOutbound}, pull(streams.StreamEvents, ingestOutbound)...),
		},
		Subscribe: &server.SubjectPermission{Allow: inbox},
	}
}

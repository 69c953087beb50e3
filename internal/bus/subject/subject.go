// Package subject builds and parses the fabric's NATS subjects and KV keys.
//
// It is the only way a tenant id or an id reaches a subject: every token is
// checked against a closed alphabet, so no '.', '*', '>', whitespace, control
// or non-ASCII byte and no empty token can change a subject's shape or let a
// subscriber of one tenant match another's (EVENT-056). Errors name the bad
// token's role, never its content.
package subject

import (
	"hash/fnv"
	"strconv"
	"strings"
)

// Limits of the token alphabets.
const (
	// MaxTenantLen bounds a tenant id: [a-z0-9_-]{1,64}.
	MaxTenantLen = 64
	// MaxGroupHexLen bounds a group id in lowercase hex (64 bytes).
	MaxGroupHexLen = 128
	// MaxClientHexLen bounds a client id in lowercase hex (32 bytes).
	MaxClientHexLen = 64
	// MessageIDHexLen is the exact length of a message id in lowercase hex
	// (a SHA-256 digest).
	MessageIDHexLen = 64
	// MaxReasonLen bounds a retention reason: [a-z0-9_-]{1,32}.
	MaxReasonLen = 32
	// MaxKeyPartLen bounds one part of a KV key after the tenant:
	// [a-z0-9_-]{1,128}.
	MaxKeyPartLen = 128
	// Partitions is the number of input partitions FABRIC_IN stores under.
	// Changing it re-maps every group, so it is fixed.
	Partitions = 64
)

// Patterns the streams are configured with.
const (
	// InputPattern matches every input subject as published.
	InputPattern = "fabric.in.*.*.*"
	// InputTransform is FABRIC_IN's subject transform destination: the
	// partition of tenant and group (not of the message id, so a group's
	// inputs share one partition and keep their order) is inserted as the
	// third token.
	InputTransform = "fabric.in.{{partition(64,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}"
	// EventsPattern matches every client event subject.
	EventsPattern = "fabric.ev.*.*"
	// CheckpointPattern matches every converge checkpoint subject.
	CheckpointPattern = "fabric.ck.>"
	// LiveTransform is the RePublish destination of EventsPattern.
	LiveTransform = "fabric.live.{{wildcard(1)}}.{{wildcard(2)}}"
	// LivePattern matches every republished event subject.
	LivePattern = "fabric.live.*.*"
	// OutcomePattern matches every outcome subject.
	OutcomePattern = "fabric.outcome.*.*"
	// RetainedPattern matches every retained-object subject.
	RetainedPattern = "fabric.retained.*.*.*"
	// IntakePattern matches every intake subject, which ingest's workers
	// answer in one queue group.
	IntakePattern = "fabric.intake.*"
	// OutboundPattern matches every outbound subject: the transport
	// messages hosted clients send (issue 19).
	OutboundPattern = "fabric.out.*.*"
	// OperationPattern matches every operation record subject.
	OperationPattern = "fabric.op.*.*"
	// OperateRequestPattern matches every operation request subject,
	// which the client API's instances answer in one queue group (issue
	// 19). No stream stores it.
	OperateRequestPattern = "fabric.operate.*.*.*"
	// BridgeRequestPattern matches every request for a bridge's consumer,
	// which ingest's workers answer in one queue group (issue 27). No
	// stream stores it.
	BridgeRequestPattern = "fabric.bridge.*.*"
)

const (
	prefixIn       = "fabric.in."
	prefixEvents   = "fabric.ev."
	prefixLive     = "fabric.live."
	prefixCk       = "fabric.ck."
	prefixOutcome  = "fabric.outcome."
	prefixRetained = "fabric.retained."
	prefixIntake   = "fabric.intake."
	prefixOut      = "fabric.out."
	prefixOp       = "fabric.op."
	prefixOperate  = "fabric.operate."
	prefixBridge   = "fabric.bridge."
)

// Token roles named in InvalidTokenError.
const (
	RoleTenant    = "tenant"
	RoleGroup     = "group id"
	RoleClient    = "client id"
	RoleMessageID = "message id"
	RoleReason    = "reason"
	RolePartition = "partition"
	RoleKeyPart   = "key part"
	RoleConsumer  = "consumer name"
	RoleSubject   = "subject"
)

// InvalidTokenError reports a token that may not reach a subject. It names
// the token's role and what is wrong, never the token itself, because ids
// must not reach logs.
type InvalidTokenError struct {
	// Role is which token is bad: one of the Role constants.
	Role string
	// Reason says what is wrong in words safe to log.
	Reason string
}

func (e *InvalidTokenError) Error() string {
	return "subject: invalid " + e.Role + ": " + e.Reason
}

func invalid(role, reason string) error { return &InvalidTokenError{Role: role, Reason: reason} }

// ValidTenant checks a tenant id against [a-z0-9_-]{1,64}.
func ValidTenant(tenant string) error {
	return checkWord(RoleTenant, tenant, MaxTenantLen)
}

// ValidGroup checks a group id: lowercase hex of whole bytes, at most
// MaxGroupHexLen characters.
func ValidGroup(groupHex string) error {
	return checkHex(RoleGroup, groupHex, MaxGroupHexLen)
}

// ValidClient checks a client id: lowercase hex of whole bytes, at most
// MaxClientHexLen characters.
func ValidClient(clientHex string) error {
	return checkHex(RoleClient, clientHex, MaxClientHexLen)
}

// ValidMessageID checks a message id: exactly MessageIDHexLen lowercase hex
// characters.
func ValidMessageID(msgIDHex string) error {
	if len(msgIDHex) != MessageIDHexLen {
		return invalid(RoleMessageID, "length is not "+strconv.Itoa(MessageIDHexLen))
	}
	return checkHex(RoleMessageID, msgIDHex, MessageIDHexLen)
}

// ValidReason checks a retention reason against [a-z0-9_-]{1,32}.
func ValidReason(reason string) error {
	return checkWord(RoleReason, reason, MaxReasonLen)
}

func checkWord(role, s string, maxLen int) error {
	if err := checkLen(role, s, maxLen); err != nil {
		return err
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return invalid(role, "character outside [a-z0-9_-]")
		}
	}
	return nil
}

func checkHex(role, s string, maxLen int) error {
	if err := checkLen(role, s, maxLen); err != nil {
		return err
	}
	if len(s)%2 != 0 {
		return invalid(role, "odd number of hex digits")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'f' || c >= '0' && c <= '9') {
			return invalid(role, "character outside lowercase hex")
		}
	}
	return nil
}

func checkLen(role, s string, maxLen int) error {
	switch {
	case s == "":
		return invalid(role, "empty")
	case len(s) > maxLen:
		return invalid(role, "longer than "+strconv.Itoa(maxLen))
	}
	return nil
}

func join(prefix string, tokens ...string) string {
	n := len(prefix)
	for _, t := range tokens {
		n += len(t) + 1
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteString(prefix)
	for i, t := range tokens {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(t)
	}
	return b.String()
}

// Input is the subject ingest publishes an input of a group on, one per
// message id so that the input is its own create-if-absent dedup record:
// fabric.in.<tenant>.<group>.<message_id>.
func Input(tenant, groupHex, msgIDHex string) (string, error) {
	if err := tenantGroupID(tenant, groupHex, msgIDHex); err != nil {
		return "", err
	}
	return join(prefixIn, tenant, groupHex, msgIDHex), nil
}

// InputByID matches the stored input of a message id in any partition and
// group of a tenant: fabric.in.*.<tenant>.*.<message_id>. It finds an input
// by its id alone, as GET …/outcomes/{message_id} must.
func InputByID(tenant, msgIDHex string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := ValidMessageID(msgIDHex); err != nil {
		return "", err
	}
	return join(prefixIn, "*", tenant, "*", msgIDHex), nil
}

func tenantGroupID(tenant, groupHex, msgIDHex string) error {
	if err := ValidTenant(tenant); err != nil {
		return err
	}
	if err := ValidGroup(groupHex); err != nil {
		return err
	}
	return ValidMessageID(msgIDHex)
}

// Partition is the input partition FABRIC_IN's transform assigns to a
// group: FNV-1a 32 of tenant and group, concatenated, modulo Partitions, as
// nats-server computes {{partition(64,1,2)}}.
func Partition(tenant, groupHex string) (int, error) {
	if err := ValidTenant(tenant); err != nil {
		return 0, err
	}
	if err := ValidGroup(groupHex); err != nil {
		return 0, err
	}
	h := fnv.New32a()
	h.Write([]byte(tenant))
	h.Write([]byte(groupHex))
	return int(h.Sum32() % Partitions), nil
}

// StoredInput is the subject FABRIC_IN stores an input under, after its
// transform: fabric.in.<partition>.<tenant>.<group>.<message_id>.
func StoredInput(tenant, groupHex, msgIDHex string) (string, error) {
	if err := ValidMessageID(msgIDHex); err != nil {
		return "", err
	}
	p, err := Partition(tenant, groupHex)
	if err != nil {
		return "", err
	}
	return join(prefixIn, strconv.Itoa(p), tenant, groupHex, msgIDHex), nil
}

// InputPartition is the consumer filter for one input partition:
// fabric.in.<p>.>.
func InputPartition(p int) (string, error) {
	if p < 0 || p >= Partitions {
		return "", invalid(RolePartition, "out of range")
	}
	return join(prefixIn, strconv.Itoa(p), ">"), nil
}

// Events is a client's event subject: fabric.ev.<tenant>.<client>.
func Events(tenant, clientHex string) (string, error) {
	if err := tenantClient(tenant, clientHex); err != nil {
		return "", err
	}
	return join(prefixEvents, tenant, clientHex), nil
}

// Live is the subject FABRIC_EVENTS republishes a client's events on:
// fabric.live.<tenant>.<client>.
func Live(tenant, clientHex string) (string, error) {
	if err := tenantClient(tenant, clientHex); err != nil {
		return "", err
	}
	return join(prefixLive, tenant, clientHex), nil
}

// LiveTenant matches the republished events of every client of a tenant:
// fabric.live.<tenant>.*.
func LiveTenant(tenant string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	return join(prefixLive, tenant, "*"), nil
}

// Checkpoint is the subject of converge's state checkpoint for a group:
// fabric.ck.<tenant>.<group>. It lives in FABRIC_EVENTS so that a group's
// events and its checkpoint are written in one atomic batch.
func Checkpoint(tenant, groupHex string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := ValidGroup(groupHex); err != nil {
		return "", err
	}
	return join(prefixCk, tenant, groupHex), nil
}

// Outcome is the subject of an input's outcome record:
// fabric.outcome.<tenant>.<message_id>.
func Outcome(tenant, msgIDHex string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := ValidMessageID(msgIDHex); err != nil {
		return "", err
	}
	return join(prefixOutcome, tenant, msgIDHex), nil
}

// Outbound is the subject a group's outbound transport messages are
// stored on: fabric.out.<tenant>.<group>.
func Outbound(tenant, groupHex string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := ValidGroup(groupHex); err != nil {
		return "", err
	}
	return join(prefixOut, tenant, groupHex), nil
}

// OutboundAll is the filter of every tenant's outbound subjects.
const OutboundAll = "fabric.out.>"

// OutboundTenant is the filter of one tenant's outbound subjects:
// fabric.out.<tenant>.*.
func OutboundTenant(tenant string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	return join(prefixOut, tenant, "*"), nil
}

// Operation is the subject of an operation's records, the last current:
// fabric.op.<tenant>.<operation_id>. An operation id has the form of a
// message id.
func Operation(tenant, opIDHex string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := ValidMessageID(opIDHex); err != nil {
		return "", err
	}
	return join(prefixOp, tenant, opIDHex), nil
}

// OperateRequest is the subject an operation of a hosted client is
// requested on over NATS: fabric.operate.<tenant>.<client>.<verb>, the
// verb an operation kind or "operation" (read a record), [a-z0-9_-]{1,32}.
func OperateRequest(tenant, clientHex, verb string) (string, error) {
	if err := tenantClient(tenant, clientHex); err != nil {
		return "", err
	}
	if err := ValidReason(verb); err != nil {
		return "", err
	}
	return join(prefixOperate, tenant, clientHex, verb), nil
}

// MaxConsumerLen bounds a consumer name a bridge asks for:
// [a-z0-9_-]{1,64}.
const MaxConsumerLen = 64

// ValidConsumer checks a consumer name a bridge asks for against
// [a-z0-9_-]{1,64}.
func ValidConsumer(name string) error { return checkWord(RoleConsumer, name, MaxConsumerLen) }

// BridgeRequest is the subject a bridge asks for its consumer on:
// fabric.bridge.<tenant>.<consumer>, the consumer of tenant's outbound
// subjects named consumer.
func BridgeRequest(tenant, consumer string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := ValidConsumer(consumer); err != nil {
		return "", err
	}
	return join(prefixBridge, tenant, consumer), nil
}

// Retained is the subject of an object retained for a group for a reason:
// fabric.retained.<tenant>.<group>.<reason>.
func Retained(tenant, groupHex, reason string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := ValidGroup(groupHex); err != nil {
		return "", err
	}
	if err := ValidReason(reason); err != nil {
		return "", err
	}
	return join(prefixRetained, tenant, groupHex, reason), nil
}

// RetainedGroup matches every retained object of a group, whatever its
// reason: fabric.retained.<tenant>.<group>.*.
func RetainedGroup(tenant, groupHex string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := ValidGroup(groupHex); err != nil {
		return "", err
	}
	return join(prefixRetained, tenant, groupHex, "*"), nil
}

// RetainedTenant matches every retained object of a tenant:
// fabric.retained.<tenant>.>.
func RetainedTenant(tenant string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	return join(prefixRetained, tenant, ">"), nil
}

// RetainedReason matches every retained object held for reason:
// fabric.retained.*.*.<reason>.
func RetainedReason(reason string) (string, error) {
	if err := ValidReason(reason); err != nil {
		return "", err
	}
	return join(prefixRetained, "*", "*", reason), nil
}

// Intake is the subject a tenant's transport messages are requested on:
// fabric.intake.<tenant>.
func Intake(tenant string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	return join(prefixIntake, tenant), nil
}

func tenantClient(tenant, clientHex string) error {
	if err := ValidTenant(tenant); err != nil {
		return err
	}
	return ValidClient(clientHex)
}

// Key is a KV key <tenant>.<part>[.<part>…]. Each part is [a-z0-9_-]{1,128},
// which covers hex ids and the short words the stores use.
func Key(tenant string, parts ...string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	if len(parts) == 0 {
		return "", invalid(RoleKeyPart, "missing")
	}
	for _, p := range parts {
		if err := checkWord(RoleKeyPart, p, MaxKeyPartLen); err != nil {
			return "", err
		}
	}
	return join("", append([]string{tenant}, parts...)...), nil
}

// ClientKey is a client's key in fabric-clients: <tenant>.<client>.
func ClientKey(tenant, clientHex string) (string, error) {
	if err := tenantClient(tenant, clientHex); err != nil {
		return "", err
	}
	return join("", tenant, clientHex), nil
}

// GroupKey is a group's key in fabric-groups, fabric-group-keys and
// fabric-converge: <tenant>.<group>.
func GroupKey(tenant, groupHex string) (string, error) {
	if err := ValidTenant(tenant); err != nil {
		return "", err
	}
	if err := ValidGroup(groupHex); err != nil {
		return "", err
	}
	return join("", tenant, groupHex), nil
}

package subject

import (
	"strconv"
	"strings"
)

// maxTokens is the most tokens split returns, ParseStoredInput's four.
const maxTokens = 4

// split checks that s is prefix followed by exactly n dot-separated tokens
// (n at most maxTokens) and returns them in an array, so that parsing a
// subject allocates nothing: the gateway parses two per event. Token
// contents are checked by the caller.
func split(s, prefix string, n int) ([maxTokens]string, error) {
	var toks [maxTokens]string
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok {
		return toks, invalid(RoleSubject, "wrong prefix")
	}
	for i := range n - 1 {
		j := strings.IndexByte(rest, '.')
		if j < 0 {
			return toks, invalid(RoleSubject, "wrong number of tokens")
		}
		toks[i], rest = rest[:j], rest[j+1:]
	}
	if strings.IndexByte(rest, '.') >= 0 {
		return toks, invalid(RoleSubject, "wrong number of tokens")
	}
	toks[n-1] = rest
	return toks, nil
}

// InputSubject is what an input subject names.
type InputSubject struct {
	// Partition is the input partition (ParseStoredInput only).
	Partition int
	// Tenant is the tenant id.
	Tenant string
	// GroupHex is the group id in lowercase hex.
	GroupHex string
	// MessageIDHex is the message id in lowercase hex.
	MessageIDHex string
}

// ParseInput reads an input subject as published,
// fabric.in.<tenant>.<group>.<message_id>.
func ParseInput(s string) (InputSubject, error) {
	toks, err := split(s, prefixIn, 3)
	if err != nil {
		return InputSubject{}, err
	}
	if err := tenantGroupID(toks[0], toks[1], toks[2]); err != nil {
		return InputSubject{}, err
	}
	return InputSubject{Tenant: toks[0], GroupHex: toks[1], MessageIDHex: toks[2]}, nil
}

// ParseStoredInput reads an input subject as FABRIC_IN stores it,
// fabric.in.<partition>.<tenant>.<group>.<message_id>. It checks that the
// partition is the one Partition computes.
func ParseStoredInput(s string) (InputSubject, error) {
	toks, err := split(s, prefixIn, 4)
	if err != nil {
		return InputSubject{}, err
	}
	p, perr := strconv.Atoi(toks[0])
	if perr != nil || p < 0 || p >= Partitions || strconv.Itoa(p) != toks[0] {
		return InputSubject{}, invalid(RolePartition, "not a partition number")
	}
	if err := tenantGroupID(toks[1], toks[2], toks[3]); err != nil {
		return InputSubject{}, err
	}
	if want, _ := Partition(toks[1], toks[2]); want != p {
		return InputSubject{}, invalid(RolePartition, "does not match tenant and group")
	}
	return InputSubject{Partition: p, Tenant: toks[1], GroupHex: toks[2], MessageIDHex: toks[3]}, nil
}

// ParseEvents reads tenant and client from fabric.ev.<tenant>.<client>.
func ParseEvents(s string) (tenant, clientHex string, err error) {
	return parseTenantClient(s, prefixEvents)
}

// ParseLive reads tenant and client from fabric.live.<tenant>.<client>.
func ParseLive(s string) (tenant, clientHex string, err error) {
	return parseTenantClient(s, prefixLive)
}

// ParseCheckpoint reads tenant and group from fabric.ck.<tenant>.<group>.
func ParseCheckpoint(s string) (tenant, groupHex string, err error) {
	return parseTenantGroup(s, prefixCk)
}

// ParseOutbound reads tenant and group from fabric.out.<tenant>.<group>.
func ParseOutbound(s string) (tenant, groupHex string, err error) {
	return parseTenantGroup(s, prefixOut)
}

// ParseOutcome reads tenant and message id from
// fabric.outcome.<tenant>.<message_id>.
func ParseOutcome(s string) (tenant, msgIDHex string, err error) {
	toks, err := split(s, prefixOutcome, 2)
	if err != nil {
		return "", "", err
	}
	if err := ValidTenant(toks[0]); err != nil {
		return "", "", err
	}
	if err := ValidMessageID(toks[1]); err != nil {
		return "", "", err
	}
	return toks[0], toks[1], nil
}

// ParseIntake reads the tenant from fabric.intake.<tenant>.
func ParseIntake(s string) (tenant string, err error) {
	toks, err := split(s, prefixIntake, 1)
	if err != nil {
		return "", err
	}
	if err := ValidTenant(toks[0]); err != nil {
		return "", err
	}
	return toks[0], nil
}

// ParseOperateRequest reads tenant, client and verb from
// fabric.operate.<tenant>.<client>.<verb>.
func ParseOperateRequest(s string) (tenant, clientHex, verb string, err error) {
	toks, err := split(s, prefixOperate, 3)
	if err != nil {
		return "", "", "", err
	}
	if err := tenantClient(toks[0], toks[1]); err != nil {
		return "", "", "", err
	}
	if err := ValidReason(toks[2]); err != nil {
		return "", "", "", err
	}
	return toks[0], toks[1], toks[2], nil
}

// ParseBridgeRequest reads tenant and consumer from
// fabric.bridge.<tenant>.<consumer>.
func ParseBridgeRequest(s string) (tenant, consumer string, err error) {
	toks, err := split(s, prefixBridge, 2)
	if err != nil {
		return "", "", err
	}
	if err := ValidTenant(toks[0]); err != nil {
		return "", "", err
	}
	if err := ValidConsumer(toks[1]); err != nil {
		return "", "", err
	}
	return toks[0], toks[1], nil
}

// ParseRetained reads tenant, group and reason from
// fabric.retained.<tenant>.<group>.<reason>.
func ParseRetained(s string) (tenant, groupHex, reason string, err error) {
	toks, err := split(s, prefixRetained, 3)
	if err != nil {
		return "", "", "", err
	}
	if err := ValidTenant(toks[0]); err != nil {
		return "", "", "", err
	}
	if err := ValidGroup(toks[1]); err != nil {
		return "", "", "", err
	}
	if err := ValidReason(toks[2]); err != nil {
		return "", "", "", err
	}
	return toks[0], toks[1], toks[2], nil
}

// ParseKey reads the tenant and the parts of a KV key built by Key,
// ClientKey or GroupKey.
func ParseKey(key string) (tenant string, parts []string, err error) {
	toks := strings.Split(key, ".")
	if len(toks) < 2 {
		return "", nil, invalid(RoleSubject, "wrong number of tokens")
	}
	if err := ValidTenant(toks[0]); err != nil {
		return "", nil, err
	}
	for _, p := range toks[1:] {
		if err := checkWord(RoleKeyPart, p, MaxKeyPartLen); err != nil {
			return "", nil, err
		}
	}
	return toks[0], toks[1:], nil
}

func parseTenantGroup(s, prefix string) (string, string, error) {
	toks, err := split(s, prefix, 2)
	if err != nil {
		return "", "", err
	}
	if err := ValidTenant(toks[0]); err != nil {
		return "", "", err
	}
	if err := ValidGroup(toks[1]); err != nil {
		return "", "", err
	}
	return toks[0], toks[1], nil
}

func parseTenantClient(s, prefix string) (string, string, error) {
	toks, err := split(s, prefix, 2)
	if err != nil {
		return "", "", err
	}
	if err := tenantClient(toks[0], toks[1]); err != nil {
		return "", "", err
	}
	return toks[0], toks[1], nil
}

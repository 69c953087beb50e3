package engine

import "errors"

// The structures below are walked, not decoded: every length is checked and
// every field skipped in place, with no allocation, so that intake can tell
// a complete MLSMessage from a cut or padded one before convergence (RFC
// 9420 §6, §7.2, §10, §12.1, §12.4; inbound processing runs the encoding
// checks first). A structure whose layout depends on a type the RFC does
// not define (a proposal or credential type from an extension) cannot be
// delimited, so it is unsupported_required_feature, not malformed.

// Causes of a refused structure, for errors.Is.
var (
	// ErrProposalType: a proposal type RFC 9420 does not define.
	ErrProposalType = errors.New("unsupported proposal type")
	// ErrCredentialType: a credential type RFC 9420 does not define.
	ErrCredentialType = errors.New("unsupported credential type")
	// ErrStructure: a selector or flag with a value its structure does not
	// allow (optional presence, leaf node source, PSK type, ...).
	ErrStructure = errors.New("invalid structure")
)

// bodyError is the classification error of a failed structure walk.
func bodyError(err error) error {
	if errors.Is(err, ErrProposalType) || errors.Is(err, ErrCredentialType) {
		return unsupportedInput(err)
	}
	return malformedInput(err)
}

func (r *reader) fail(err error) bool {
	r.failed = err
	return false
}

func (r *reader) skipVar() bool {
	var skip []byte
	return r.varBytes(&skip)
}

// skipVars skips n opaque<V> fields.
func (r *reader) skipVars(n int) bool {
	for range n {
		if !r.skipVar() {
			return false
		}
	}
	return true
}

func (r *reader) skip(n int) bool {
	if len(r.b)-r.off < n {
		return r.fail(ErrTruncated)
	}
	r.off += n
	return true
}

// end requires that nothing follows the structure.
func (r *reader) end() bool {
	if r.off != len(r.b) {
		return r.fail(ErrTrailing)
	}
	return true
}

// element is the kind of the elements of a <V> vector.
type element uint8

const (
	elemOpaque element = iota
	elemExtension
	elemHPKECiphertext
	elemUpdatePathNode
	elemProposalOrRef
	elemEncryptedGroupSecrets
)

// vector walks a <V> vector of elements of one kind: every element must
// end exactly at the vector's end. (A switch rather than a func value, so
// the sub-reader stays on the stack.)
func (r *reader) vector(e element) bool {
	var body []byte
	if !r.varBytes(&body) {
		return false
	}
	sub := reader{b: body}
	for sub.off < len(sub.b) {
		var ok bool
		switch e {
		case elemOpaque:
			ok = sub.skipVar()
		case elemExtension:
			ok = walkExtension(&sub)
		case elemHPKECiphertext:
			ok = walkHPKECiphertext(&sub)
		case elemUpdatePathNode:
			ok = walkUpdatePathNode(&sub)
		case elemProposalOrRef:
			ok = walkProposalOrRef(&sub)
		case elemEncryptedGroupSecrets:
			ok = walkEncryptedGroupSecrets(&sub)
		}
		if !ok {
			return r.fail(sub.err())
		}
	}
	return true
}

// fixedVector walks a <V> vector of size-byte elements.
func (r *reader) fixedVector(size int) bool {
	var body []byte
	if !r.varBytes(&body) {
		return false
	}
	if len(body)%size != 0 {
		return r.fail(ErrTruncated)
	}
	return true
}

func (r *reader) u8Of(allowed ...uint8) (uint8, bool) {
	v, ok := r.u8()
	if !ok {
		return 0, r.fail(ErrTruncated)
	}
	for _, a := range allowed {
		if v == a {
			return v, true
		}
	}
	return v, r.fail(ErrStructure)
}

func (r *reader) skipU16() bool {
	if _, ok := r.u16(); !ok {
		return r.fail(ErrTruncated)
	}
	return true
}

// extension: uint16 extension_type; opaque extension_data<V>.
func walkExtension(r *reader) bool { return r.skipU16() && r.skipVar() }

func walkExtensions(r *reader) bool { return r.vector(elemExtension) }

// walkCredential: basic carries identity<V>, x509 certificates<V> of
// opaque cert_data<V> (RFC 9420 §5.3).
func walkCredential(r *reader) bool {
	t, ok := r.u16()
	if !ok {
		return r.fail(ErrTruncated)
	}
	switch t {
	case 1:
		return r.skipVar()
	case 2:
		return r.vector(elemOpaque)
	}
	return r.fail(ErrCredentialType)
}

// walkLeafNode: RFC 9420 §7.2.
func walkLeafNode(r *reader) bool {
	// encryption_key, signature_key, credential
	if !r.skipVars(2) || !walkCredential(r) {
		return false
	}
	// Capabilities: versions, cipher_suites, extensions, proposals,
	// credentials, each a vector of uint16.
	for range 5 {
		if !r.fixedVector(2) {
			return false
		}
	}
	src, ok := r.u8Of(1, 2, 3) // key_package, update, commit
	if !ok {
		return false
	}
	switch src {
	case 1:
		if !r.skip(16) { // lifetime: not_before, not_after
			return false
		}
	case 3:
		if !r.skipVar() { // parent_hash
			return false
		}
	}
	return walkExtensions(r) && r.skipVar() // signature
}

// walkKeyPackage: RFC 9420 §10; version and cipher suite are judged by
// whoever uses it.
func walkKeyPackage(r *reader) bool {
	// version, cipher_suite, init_key, leaf_node, extensions, signature
	return r.skip(4) && r.skipVar() && walkLeafNode(r) && walkExtensions(r) && r.skipVar()
}

// walkPreSharedKeyID: RFC 9420 §8.4.
func walkPreSharedKeyID(r *reader) bool {
	t, ok := r.u8Of(1, 2) // external, resumption
	if !ok {
		return false
	}
	if t == 1 {
		if !r.skipVar() {
			return false
		}
	} else if !r.skip(1) || !r.skipVar() || !r.skip(8) { // usage, psk_group_id, psk_epoch
		return false
	}
	return r.skipVar() // psk_nonce
}

// walkProposal: RFC 9420 §12.1.
func walkProposal(r *reader) bool {
	t, ok := r.u16()
	if !ok {
		return r.fail(ErrTruncated)
	}
	switch t {
	case 1: // add
		return walkKeyPackage(r)
	case 2: // update
		return walkLeafNode(r)
	case 3: // remove
		return r.skip(4)
	case 4: // psk
		return walkPreSharedKeyID(r)
	case 5: // reinit: group_id, version, cipher_suite, extensions
		return r.skipVar() && r.skip(4) && walkExtensions(r)
	case 6: // external_init: kem_output
		return r.skipVar()
	case 7: // group_context_extensions
		return walkExtensions(r)
	}
	return r.fail(ErrProposalType)
}

// walkProposalOrRef: RFC 9420 §12.4.
func walkProposalOrRef(r *reader) bool {
	t, ok := r.u8Of(1, 2) // proposal, reference
	if !ok {
		return false
	}
	if t == 1 {
		return walkProposal(r)
	}
	return r.skipVar()
}

// walkHPKECiphertext: kem_output<V>, ciphertext<V>.
func walkHPKECiphertext(r *reader) bool { return r.skipVars(2) }

// walkUpdatePathNode: encryption_key<V>, encrypted_path_secret<V>.
func walkUpdatePathNode(r *reader) bool {
	return r.skipVar() && r.vector(elemHPKECiphertext)
}

// walkCommit: RFC 9420 §12.4.
func walkCommit(r *reader) bool {
	if !r.vector(elemProposalOrRef) {
		return false
	}
	present, ok := r.u8Of(0, 1)
	if !ok || present == 0 {
		return ok
	}
	return walkLeafNode(r) && r.vector(elemUpdatePathNode)
}

// walkPublicBody walks a PublicMessage after its content type: the
// content, the auth data (signature, and a commit's confirmation_tag) and a
// member sender's membership_tag, to the last byte (RFC 9420 §6.2).
func walkPublicBody(r *reader, ct ContentType, sender SenderType) bool {
	var ok bool
	switch ct {
	case ContentApplication:
		ok = r.skipVar()
	case ContentProposal:
		ok = walkProposal(r)
	case ContentCommit:
		ok = walkCommit(r)
	default:
		return r.fail(ErrContentType)
	}
	if !ok || !r.skipVar() {
		return false
	}
	if ct == ContentCommit && !r.skipVar() {
		return false
	}
	if sender == SenderMember && !r.skipVar() {
		return false
	}
	return r.end()
}

// walkEncryptedGroupSecrets: new_member (KeyPackageRef) and the HPKE
// ciphertext of the GroupSecrets.
func walkEncryptedGroupSecrets(r *reader) bool {
	return r.skipVar() && walkHPKECiphertext(r)
}

// walkWelcomeBody walks a Welcome after its cipher suite (RFC 9420
// §12.4.3.1).
func walkWelcomeBody(r *reader) bool {
	return r.vector(elemEncryptedGroupSecrets) && r.skipVar() && r.end()
}

// walkGroupInfoBody walks a GroupInfo after its GroupContext's group id
// and epoch (RFC 9420 §8.1, §12.4.3).
func walkGroupInfoBody(r *reader) bool {
	// tree_hash, confirmed_transcript_hash, the GroupContext's extensions
	// and the GroupInfo's, confirmation_tag, signer, signature.
	if !r.skipVars(2) {
		return false
	}
	for range 2 {
		if !walkExtensions(r) {
			return false
		}
	}
	return r.skipVar() && r.skip(4) && r.skipVar() && r.end()
}

// walkKeyPackageBody walks a KeyPackage after its version and cipher suite.
func walkKeyPackageBody(r *reader) bool {
	return r.skipVar() && walkLeafNode(r) && walkExtensions(r) && r.skipVar() && r.end()
}

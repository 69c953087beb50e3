package engine

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"testing"

	"github.com/fabric-mls/fabric/internal/testpeer"
	"github.com/fabric-mls/fabric/pkg/schema"
)

type messagesVector struct {
	MLSWelcome               string `json:"mls_welcome"`
	MLSGroupInfo             string `json:"mls_group_info"`
	MLSKeyPackage            string `json:"mls_key_package"`
	PublicMessageApplication string `json:"public_message_application"`
	PublicMessageProposal    string `json:"public_message_proposal"`
	PublicMessageCommit      string `json:"public_message_commit"`
	PrivateMessage           string `json:"private_message"`
}

var classOf = map[ContentType]schema.InputClass{
	ContentApplication: schema.ClassApplication,
	ContentProposal:    schema.ClassProposal,
	ContentCommit:      schema.ClassCommit,
}

type classifyCase struct {
	name  string
	wf    WireFormat
	class schema.InputClass
	ct    ContentType
	msg   []byte
}

func messageCases(t testing.TB) []classifyCase {
	var vecs []messagesVector
	loadJSON(t, "messages.json", &vecs)
	if len(vecs) != 300 {
		t.Fatalf("messages.json has %d vectors", len(vecs))
	}
	var out []classifyCase
	for _, v := range vecs {
		out = append(out,
			classifyCase{"mls_welcome", WireWelcome, schema.ClassWelcome, 0, unhex(t, v.MLSWelcome)},
			classifyCase{"mls_group_info", WireGroupInfo, schema.ClassGroupInfo, 0, unhex(t, v.MLSGroupInfo)},
			classifyCase{"mls_key_package", WireKeyPackage, schema.ClassKeyPackage, 0, unhex(t, v.MLSKeyPackage)},
			classifyCase{"public_message_application", WirePublicMessage, schema.ClassApplication, ContentApplication, unhex(t, v.PublicMessageApplication)},
			classifyCase{"public_message_proposal", WirePublicMessage, schema.ClassProposal, ContentProposal, unhex(t, v.PublicMessageProposal)},
			classifyCase{"public_message_commit", WirePublicMessage, schema.ClassCommit, ContentCommit, unhex(t, v.PublicMessageCommit)},
			// The private_message vectors hold every content type; the
			// check below ties the class to the content type read.
			classifyCase{"private_message", WirePrivateMessage, "", 0, unhex(t, v.PrivateMessage)},
		)
	}
	return out
}

func TestClassifyMessagesVectors(t *testing.T) {
	for i, tc := range messageCases(t) {
		c, err := Classify(tc.msg)
		if err != nil {
			t.Fatalf("case %d %s: %v", i, tc.name, err)
		}
		if tc.class == "" {
			tc.class, tc.ct = classOf[c.ContentType], c.ContentType
		}
		if c.WireFormat != tc.wf || c.Class != tc.class || c.ContentType != tc.ct || c.Class == "" {
			t.Fatalf("case %d %s: got %d %s %d", i, tc.name, c.WireFormat, c.Class, c.ContentType)
		}
		if c.MessageID != sha256.Sum256(tc.msg) {
			t.Fatalf("case %d %s: message id is not SHA-256 of the bytes", i, tc.name)
		}
		switch tc.wf {
		case WirePublicMessage, WirePrivateMessage, WireGroupInfo:
			if !c.HasEpoch || len(c.GroupID) == 0 {
				t.Fatalf("case %d %s: group id and epoch not visible", i, tc.name)
			}
		default:
			if !SupportedCipherSuite(c.CipherSuite) {
				t.Fatalf("case %d %s: cipher suite %d", i, tc.name, c.CipherSuite)
			}
		}
	}
}

// The private message vectors carry the same group id and epoch in every
// wire format of a vector object.
func TestClassifyGroupIDMatchesAcrossFormats(t *testing.T) {
	var vecs []messagesVector
	loadJSON(t, "messages.json", &vecs)
	v := vecs[0]
	pub, err := Classify(unhex(t, v.PublicMessageCommit))
	if err != nil {
		t.Fatal(err)
	}
	priv, err := Classify(unhex(t, v.PrivateMessage))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pub.GroupID, priv.GroupID) || pub.Epoch != priv.Epoch {
		t.Fatalf("public %x/%d private %x/%d", pub.GroupID, pub.Epoch, priv.GroupID, priv.Epoch)
	}
}

func TestDeserializationVectors(t *testing.T) {
	var vecs []struct {
		Header string `json:"vlbytes_header"`
		Length uint64 `json:"length"`
	}
	loadJSON(t, "deserialization.json", &vecs)
	if len(vecs) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range vecs {
		h := unhex(t, v.Header)
		n, size, err := readVarint(h)
		if err != nil || n != v.Length || size != len(h) {
			t.Fatalf("header %s: got %d size %d err %v, want %d", v.Header, n, size, err, v.Length)
		}
	}
	for _, bad := range [][]byte{{0x40, 0x3f}, {0x80, 0x00, 0x3f, 0xff}, {0xc0, 0, 0, 0, 0, 0, 0, 1}, {0x40}, {}} {
		if _, _, err := readVarint(bad); err == nil {
			t.Fatalf("varint %x accepted", bad)
		}
	}
}

func TestClassifyFailsClosed(t *testing.T) {
	cases := []struct {
		name string
		msg  []byte
		cat  schema.Category
		err  error
	}{
		{"empty", nil, schema.CategoryInvalidEncoding, ErrTruncated},
		{"version only", []byte{0, 1}, schema.CategoryInvalidEncoding, ErrTruncated},
		{"mls 2.0", []byte{0, 2, 0, 1}, schema.CategoryUnsupportedRequiredFeature, ErrVersion},
		{"private-use wire format", []byte{0, 1, 0xf0, 0x00, 1}, schema.CategoryUnsupportedRequiredFeature, ErrWireFormat},
		{"welcome suite 7", []byte{0, 1, 0, 3, 0, 7, 0}, schema.CategoryUnsupportedRequiredFeature, ErrCipherSuite},
		{"welcome header only", []byte{0, 1, 0, 3, 0, 1}, schema.CategoryInvalidEncoding, ErrTruncated},
		{"private bad content type", []byte{0, 1, 0, 2, 1, 0xAA, 0, 0, 0, 0, 0, 0, 0, 1, 9, 0, 0, 0}, schema.CategoryInvalidEncoding, ErrContentType},
		{"private trailing", []byte{0, 1, 0, 2, 1, 0xAA, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0}, schema.CategoryInvalidEncoding, ErrTrailing},
		{"non-minimal group id length", []byte{0, 1, 0, 2, 0x40, 0x01, 0xAA}, schema.CategoryInvalidEncoding, ErrVarint},
		{"public bad sender", []byte{0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9}, schema.CategoryInvalidEncoding, ErrSenderType},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Classify(tc.msg)
			if CategoryOf(err) != tc.cat || !errors.Is(err, tc.err) {
				t.Fatalf("err = %v (category %q), want %q / %v", err, CategoryOf(err), tc.cat, tc.err)
			}
		})
	}
	ok := []byte{0, 1, 0, 2, 1, 0xAA, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0}
	if c, err := Classify(ok); err != nil || c.Class != schema.ClassApplication || c.Epoch != 1 {
		t.Fatalf("minimal private message: %+v %v", c, err)
	}
}

// Every one-byte mutation of every vector message classifies or fails with a
// category; none panics.
func TestClassifyMutations(t *testing.T) {
	cases := messageCases(t)
	for _, tc := range cases[:7*20] {
		msg := bytes.Clone(tc.msg)
		limit := min(len(msg), 96)
		for i := range limit {
			orig := msg[i]
			for _, x := range []byte{0x00, 0xff, orig ^ 0x40, orig + 1} {
				msg[i] = x
				if _, err := Classify(msg); err != nil && CategoryOf(err) == "" {
					t.Fatalf("%s byte %d: error without category: %v", tc.name, i, err)
				}
			}
			msg[i] = orig
		}
		for n := range len(msg) {
			if _, err := Classify(msg[:n]); err != nil && CategoryOf(err) == "" {
				t.Fatalf("%s truncated to %d: error without category", tc.name, n)
			}
		}
	}
}

func FuzzClassify(f *testing.F) {
	for i, tc := range messageCases(f) {
		if i < 7*4 {
			f.Add(tc.msg)
		}
	}
	f.Add([]byte{0, 1, 0, 2, 1, 0xAA, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := Classify(b)
		if err != nil {
			if cat := CategoryOf(err); cat != schema.CategoryInvalidEncoding && cat != schema.CategoryUnsupportedRequiredFeature {
				t.Fatalf("category %q", cat)
			}
			return
		}
		if !c.Class.Valid() || c.MessageID != sha256.Sum256(b) {
			t.Fatalf("classification %+v", c)
		}
	})
}

// Inbound processing runs the encoding checks before convergence: a real
// message of any wire format cut anywhere (a commit to half its length or
// one byte short, a Welcome to 10 bytes or one byte short), or with a byte
// appended, is invalid_encoding at classification, never left for
// convergence to call stale_epoch or to fail on later.
func TestTruncatedOrPaddedMessageIsInvalidEncoding(t *testing.T) {
	samples, err := testpeer.Samples()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples {
		t.Run(s.Name, func(t *testing.T) {
			if _, err := Classify(s.MLS); err != nil {
				t.Fatalf("whole message: %v", err)
			}
			for n := range len(s.MLS) {
				if _, err := Classify(s.MLS[:n]); CategoryOf(err) != schema.CategoryInvalidEncoding {
					t.Fatalf("cut to %d of %d bytes: err = %v, want invalid_encoding", n, len(s.MLS), err)
				}
			}
			padded := append(bytes.Clone(s.MLS), 0)
			if _, err := Classify(padded); CategoryOf(err) != schema.CategoryInvalidEncoding || !errors.Is(err, ErrTrailing) {
				t.Fatalf("a byte appended: err = %v, want invalid_encoding (trailing)", err)
			}
		})
	}
}

// A structure whose layout an extension defines cannot be delimited, so it
// is an unsupported feature rather than malformed input.
func TestUnknownProposalTypeIsUnsupported(t *testing.T) {
	// A PublicMessage proposal from an external sender (index 0) of proposal
	// type 0x0a0a, then an empty signature.
	msg := []byte{0, 1, 0, 1, 1, 0xAA, 0, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 0, 2, 0x0a, 0x0a, 0}
	_, err := Classify(msg)
	if CategoryOf(err) != schema.CategoryUnsupportedRequiredFeature || !errors.Is(err, ErrProposalType) {
		t.Fatalf("err = %v, want unsupported_required_feature (proposal type)", err)
	}
}

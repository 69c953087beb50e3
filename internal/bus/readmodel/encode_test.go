package readmodel

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/fabric-mls/fabric/pkg/schema"
)

// The hand-written msgpack records are byte for byte what the struct tags
// give, with every optional field absent and present.
func TestRecordsMsgpackMatchesTags(t *testing.T) {
	type taggedMessage Message // the same fields and tags, without EncodeMsgpack
	type taggedPointer Pointer
	id, group := bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{9}, 16)
	for _, m := range []Message{
		{},
		{N: 1, ID: id, GroupID: group, SenderInboxID: "ab12", SenderInstallation: []byte{1, 2}, Seq: 1 << 40, SentAt: -5, State: StateDelivered},
		{N: 1<<64 - 1, ID: id, GroupID: group, SenderInboxID: "ab12", Seq: 3, SentAt: 1_700_000_000_000, ExpiresAt: 1_700_000_060_000, State: StateDeleted,
			ContentType: &schema.ContentTypeID{AuthorityID: "xmtp.org", TypeID: "text", VersionMajor: 1}, DeletedBy: "cd34", Content: []byte("sealed")},
	} {
		compare(t, m, taggedMessage(m))
	}
	for _, p := range []Pointer{{}, {GroupID: group, N: 1 << 33}} {
		compare(t, p, taggedPointer(p))
	}
}

func compare(t *testing.T, v, tagged any) {
	t.Helper()
	got, err := encode(v)
	if err != nil {
		t.Fatal(err)
	}
	want, err := msgpack.Marshal(tagged)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%+v:\n got %x\nwant %x", v, got, want)
	}
}

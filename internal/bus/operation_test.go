package bus

import (
	"bytes"
	"errors"
	"testing"

	"github.com/fabric-mls/fabric/pkg/schema"
)

func sampleOperation() OperationRequest {
	id := OperationID("acme", "c0ffee01", "key-1")
	name := "team"
	return OperationRequest{ID: id, Kind: schema.OpUpdateConversation, ClientID: "c0ffee01", GroupID: OperationGroupID(id),
		Patch: &ComponentsPatch{Name: &name}, KeyPackages: [][]byte{{1, 2}}, Time: 1}
}

// The same idempotency key from the same client is the same operation and
// names the same new group; another client's or key's is another.
func TestOperationIDIsTheIdempotencyKey(t *testing.T) {
	a := OperationID("acme", "c0ffee01", "k")
	if !bytes.Equal(a, OperationID("acme", "c0ffee01", "k")) {
		t.Fatal("same key, another id")
	}
	for _, o := range [][]byte{OperationID("acme", "c0ffee02", "k"), OperationID("acme2", "c0ffee01", "k"), OperationID("acme", "c0ffee01", "k2"), OperationID("acme", "c0ffee0", "1k")} {
		if bytes.Equal(a, o) {
			t.Fatal("another client, tenant or key has the same operation id")
		}
	}
	if bytes.Equal(OperationGroupID(a), a) || len(OperationGroupID(a)) != 32 {
		t.Fatal("group id of a create")
	}
}

func TestOperationRoundTripAndStrictDecode(t *testing.T) {
	req := sampleOperation()
	b, err := EncodeOperation(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeOperation(b)
	if err != nil || got.Kind != req.Kind || *got.Patch.Name != "team" || !bytes.Equal(got.GroupID, req.GroupID) || got.V != operationVersion {
		t.Fatalf("round trip %+v %v", got, err)
	}
	bad := map[string]OperationRequest{}
	r := req
	r.Kind = "shout"
	bad["kind"] = r
	r = req
	r.ID = []byte{1}
	bad["id"] = r
	r = req
	r.ClientID = "NOT HEX"
	bad["client"] = r
	r = req
	r.GroupID = nil
	bad["group"] = r
	for what, r := range bad {
		b, err := EncodeOperation(r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeOperation(b); !errors.Is(err, ErrMalformedOperation) {
			t.Errorf("%s: %v, want ErrMalformedOperation", what, err)
		}
	}
	if _, err := DecodeOperation(append(b, 0)); !errors.Is(err, ErrMalformedOperation) {
		t.Errorf("trailing byte: %v", err)
	}
}

// FuzzDecodeOperation: DecodeOperation never panics, and what it accepts
// encodes and decodes to the same request.
func FuzzDecodeOperation(f *testing.F) {
	b, err := EncodeOperation(sampleOperation())
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{0x80})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeOperation(b)
		if err != nil {
			return
		}
		again, err := EncodeOperation(r)
		if err != nil {
			t.Fatal(err)
		}
		r2, err := DecodeOperation(again)
		if err != nil || r2.Kind != r.Kind || !bytes.Equal(r2.ID, r.ID) || !bytes.Equal(r2.GroupID, r.GroupID) {
			t.Fatalf("re-decoded %+v %v", r2, err)
		}
	})
}

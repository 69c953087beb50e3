package readmodel

import "github.com/vmihailenco/msgpack/v5"

// EncodeMsgpack writes m as its struct tags say, without reflection:
// converge writes a message's record for every message it delivers
// (TestRecordsMsgpackMatchesTags).
func (m Message) EncodeMsgpack(enc *msgpack.Encoder) error {
	n := 8 + count(m.ExpiresAt != 0) + count(m.ContentType != nil) + count(m.DeletedBy != "") + count(len(m.Content) > 0)
	w := fieldWriter{enc: enc}
	w.mapLen(n)
	w.uint("n", m.N)
	w.bytes("id", m.ID)
	w.bytes("group_id", m.GroupID)
	w.str("sender_inbox_id", m.SenderInboxID)
	w.bytes("sender_installation", m.SenderInstallation)
	w.uint("seq", m.Seq)
	w.int("sent_at", m.SentAt)
	if m.ExpiresAt != 0 {
		w.int("expires_at", m.ExpiresAt)
	}
	w.str("state", string(m.State))
	if m.ContentType != nil {
		w.key("content_type")
		if w.err == nil {
			w.err = enc.Encode(m.ContentType)
		}
	}
	if m.DeletedBy != "" {
		w.str("deleted_by", m.DeletedBy)
	}
	if len(m.Content) > 0 {
		w.bytes("content", m.Content)
	}
	return w.err
}

// EncodeMsgpack writes p as its struct tags say, without reflection.
func (p Pointer) EncodeMsgpack(enc *msgpack.Encoder) error {
	w := fieldWriter{enc: enc}
	w.mapLen(2)
	w.bytes("group_id", p.GroupID)
	w.uint("n", p.N)
	return w.err
}

func count(b bool) int {
	if b {
		return 1
	}
	return 0
}

// fieldWriter writes the fields of a msgpack map as the reflecting encoder
// does (64-bit integers in full), keeping the first error.
type fieldWriter struct {
	enc *msgpack.Encoder
	err error
}

func (w *fieldWriter) mapLen(n int) {
	if w.err == nil {
		w.err = w.enc.EncodeMapLen(n)
	}
}

func (w *fieldWriter) key(k string) {
	if w.err == nil {
		w.err = w.enc.EncodeString(k)
	}
}

func (w *fieldWriter) uint(k string, v uint64) {
	if w.key(k); w.err == nil {
		w.err = w.enc.EncodeUint64(v)
	}
}

func (w *fieldWriter) int(k string, v int64) {
	if w.key(k); w.err == nil {
		w.err = w.enc.EncodeInt64(v)
	}
}

func (w *fieldWriter) str(k, v string) {
	if w.key(k); w.err == nil {
		w.err = w.enc.EncodeString(v)
	}
}

func (w *fieldWriter) bytes(k string, v []byte) {
	if w.key(k); w.err == nil {
		w.err = w.enc.EncodeBytes(v)
	}
}

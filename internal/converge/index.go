package converge

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
)

// The message index (groupState.Messages) is stored in chunks: the entries
// of ordinals [c·messageChunkLen, (c+1)·messageChunkLen) form chunk c. A
// full chunk is a blob of its own, written once and named by every later
// checkpoint until an entry of it changes (a deletion or an expiry) or the
// index drops all of it; the entries after the last full chunk ride inline
// in the group state. So a transaction writes what it changed, not the
// whole index: up to maxMessages entries of about 200 bytes each.
const messageChunkLen = 128

// messageChunk is the stored form of one full chunk. First is the ordinal
// of Messages[0]: the chunk's first ordinal, or later when the index had
// dropped its oldest entries before the chunk was written again.
type messageChunk struct {
	First    uint64          `msgpack:"first"`
	Messages []storedMessage `msgpack:"messages"`
}

// chunkRef names the blob of chunk N.
type chunkRef struct {
	N   uint64 `msgpack:"n"`
	Key string `msgpack:"key"`
}

// messageIndex returns the position in Messages of the message id, or -1.
func (g *groupState) messageIndex(id []byte) int {
	if len(id) == 0 {
		return -1 // most messages reference nothing: no scan
	}
	return slices.IndexFunc(g.Messages, func(m storedMessage) bool { return bytes.Equal(m.ID, id) })
}

// message finds a stored message by id, for reading: a change goes through
// deleteMessage.
func (g *groupState) message(id []byte) *storedMessage {
	if i := g.messageIndex(id); i >= 0 {
		return &g.Messages[i]
	}
	return nil
}

// deleteMessage marks Messages[i] deleted.
func (g *groupState) deleteMessage(i int) {
	g.Messages[i].Deleted = true
	if g.touched == nil {
		g.touched = map[uint64]bool{}
	}
	g.touched[(g.MessageBase+uint64(i))/messageChunkLen] = true
}

// addMessage indexes a message, dropping the oldest beyond the bound.
func (g *groupState) addMessage(m storedMessage) {
	g.Messages = append(g.Messages, m)
	if drop := len(g.Messages) - maxMessages; drop > 0 {
		g.Messages = slices.Delete(g.Messages, 0, drop)
		g.MessageBase += uint64(drop)
	}
}

// fullChunks returns the numbers of the index's full chunks, first to
// last (first > last when there are none), and how many entries of
// Messages they hold.
func (g *groupState) fullChunks() (first, last uint64, held int) {
	end := (g.MessageBase + uint64(len(g.Messages))) / messageChunkLen
	first = g.MessageBase / messageChunkLen
	if end*messageChunkLen <= g.MessageBase {
		return first, first - 1, 0
	}
	return first, end - 1, int(end*messageChunkLen - g.MessageBase)
}

// storeIndex prepares the index for a checkpoint whose predecessor named
// the chunk blobs prev: it returns the refs of every full chunk, the blobs
// of those to write (new, or changed since prev), and the group state to
// store, whose Messages are the entries after the last full chunk.
func (g *groupState) storeIndex(tenant, groupHex string, prev []chunkRef) (refs []chunkRef, blobs map[string][]byte, stored *groupState, err error) {
	first, last, held := g.fullChunks()
	blobs = map[string][]byte{}
	for c := first; c <= last && held > 0; c++ {
		if i := slices.IndexFunc(prev, func(r chunkRef) bool { return r.N == c }); i >= 0 && !g.touched[c] {
			refs = append(refs, prev[i])
			continue
		}
		from := max(c*messageChunkLen, g.MessageBase)
		b, err := msgpack.Marshal(messageChunk{First: from, Messages: g.Messages[from-g.MessageBase : (c+1)*messageChunkLen-g.MessageBase]})
		if err != nil {
			return nil, nil, nil, fmt.Errorf("encode message chunk: %w", err)
		}
		key, err := freshKey(tenant, groupHex, "i") // <tenant>.<group>.i.<nonce>
		if err != nil {
			return nil, nil, nil, err
		}
		refs = append(refs, chunkRef{N: c, Key: key})
		blobs[key] = b
	}
	g.touched = nil
	s := *g
	s.Messages = g.Messages[held:]
	return refs, blobs, &s, nil
}

// loadIndex puts the chunks refs names back in front of the inline entries
// of g, a group state as stored; get reads a blob.
func (g *groupState) loadIndex(refs []chunkRef, get func(key string) ([]byte, error)) error {
	if len(refs) == 0 {
		return nil
	}
	first := g.MessageBase / messageChunkLen
	var msgs []storedMessage
	for i, r := range refs {
		c := first + uint64(i)
		if r.N != c {
			return fmt.Errorf("load message index: chunk %d where %d belongs", r.N, c)
		}
		b, err := get(r.Key)
		if err != nil {
			return fmt.Errorf("load message chunk %d: %w", c, err)
		}
		var mc messageChunk
		if err := msgpack.Unmarshal(b, &mc); err != nil {
			return fmt.Errorf("decode message chunk %d: %w", c, err)
		}
		end := mc.First + uint64(len(mc.Messages))
		if mc.First < c*messageChunkLen || mc.First > max(c*messageChunkLen, g.MessageBase) || end != (c+1)*messageChunkLen {
			return fmt.Errorf("decode message chunk %d: holds ordinals %d to %d", c, mc.First, end)
		}
		msgs = append(msgs, mc.Messages[max(g.MessageBase, mc.First)-mc.First:]...)
	}
	g.Messages = append(msgs, g.Messages...)
	return nil
}

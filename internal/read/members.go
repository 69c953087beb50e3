package read

import (
	"fmt"
	"net/http"
	"slices"

	"github.com/fabric-mls/fabric/internal/bus/readmodel"
	"github.com/fabric-mls/fabric/internal/components"
	"github.com/fabric-mls/fabric/pkg/schema"
)

func (a *API) getMembers(r *http.Request, c call) (any, error) {
	g, conv, err := a.pathConversation(r, c)
	if err != nil {
		return nil, err
	}
	out := schema.MemberList{Epoch: conv.Epoch, Members: []schema.Member{}}
	if conv.Removed {
		return out, nil // the client holds no roster of a group it left
	}
	subj, err := readmodel.MembersSubject(c.tenant, g)
	if err != nil {
		return nil, err
	}
	st, err := readmodel.Last(r.Context(), a.cfg.JS, subj)
	if err != nil {
		return nil, err
	}
	if st.Seq == 0 || len(st.Data) == 0 {
		return out, nil
	}
	var rec readmodel.Members
	if err := schema.UnmarshalMsgpack(st.Data, &rec); err != nil {
		return nil, fmt.Errorf("read: decode members: %w", err)
	}
	set, _ := components.Decode(conv.Components)
	out.Epoch = rec.Epoch
	for _, m := range rec.Members {
		mm := schema.Member{InboxID: m.InboxID, Role: schema.RoleMember, Installations: make([]schema.Bytes, len(m.Installations))}
		for i, k := range m.Installations {
			mm.Installations[i] = k
		}
		if id, err := components.ParseInboxID(m.InboxID); err == nil {
			switch {
			case slices.Contains(set.SuperAdmins, id):
				mm.Role = schema.RoleSuperAdmin
			case slices.Contains(set.Admins, id):
				mm.Role = schema.RoleAdmin
			}
		}
		held, ok, err := a.cfg.Stores.Identity(r.Context(), c.tenant, c.client, m.InboxID)
		if err != nil {
			return nil, err
		}
		if ok {
			mm.Association = &schema.Association{SequenceID: held.SequenceID, InstallationKeys: held.InstallationKeys, DisplayHandle: held.DisplayHandle}
		}
		out.Members = append(out.Members, mm)
	}
	return out, nil
}

package allinone

import (
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/bcrypt"

	"github.com/fabric-mls/fabric/internal/bus/subject"
)

// A tenant's NATS user (issue 27): what a tenant's transport gateway or app
// connects with to ask its intake (fabric.intake.<tenant>) and its
// operations (fabric.operate.<tenant>.<client>.<verb>) over NATS, answered
// on its own inbox. The all-in-one loads the users whose passwords
// ProvisionTenantUser wrote in its data directory; a deployment adds the
// block TenantUserConf renders to its accounts.conf. Requests still need
// the tenant's bearer token (ingest -nats-require-token, always on in the
// all-in-one; operations always).

// tenantUserPrefix starts every tenant user's name.
const tenantUserPrefix = "tenant-"

// TenantUser is tenant's NATS user: tenant-<tenant>.
func TenantUser(tenant string) string { return tenantUserPrefix + tenant }

// TenantPermissions are what tenant's user may do: publish its intake
// subject and its operation requests, read its own inbox, nothing else.
// The workers answer on the requester's reply subject (their
// allow_responses), so the user needs no other subscription.
func TenantPermissions(tenant string) (*server.Permissions, error) {
	intake, err := subject.Intake(tenant)
	if err != nil {
		return nil, fmt.Errorf("allinone: tenant user: %w", err)
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{intake, "fabric.operate." + tenant + ".*.*"}},
		Subscribe: &server.SubjectPermission{Allow: []string{InboxPrefix(TenantUser(tenant)) + ".>"}},
	}, nil
}

// ProvisionTenantUser makes tenant's user on the all-in-one of dataDir:
// it writes a generated password to NATSPasswordFile(dataDir,
// TenantUser(tenant)), or reads the one there, and returns it. A running
// all-in-one loads it within tenantUsersInterval.
func ProvisionTenantUser(dataDir, tenant string) (string, error) {
	if err := subject.ValidTenant(tenant); err != nil {
		return "", fmt.Errorf("allinone: tenant user: %w", err)
	}
	pw, err := loadOrGenerate(dataDir, filepath.Base(NATSPasswordFile(dataDir, TenantUser(tenant))), natsPasswordBytes)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%x", pw), nil
}

// tenantPasswords reads the tenant users' passwords in dataDir: each
// nats-tenant-<tenant>-password file, by user.
func tenantPasswords(dataDir string) (map[string]string, error) {
	files, err := filepath.Glob(filepath.Join(dataDir, "nats-"+tenantUserPrefix+"*-password"))
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, f := range files {
		tenant := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "nats-"+tenantUserPrefix), "-password")
		if subject.ValidTenant(tenant) != nil {
			continue // not a file ProvisionTenantUser wrote
		}
		pw, err := loadSecret(dataDir, filepath.Base(f), natsPasswordBytes)
		if err != nil {
			return nil, err
		}
		out[TenantUser(tenant)] = fmt.Sprintf("%x", pw)
	}
	return out, nil
}

// TenantUserConf renders tenant's user for the FABRIC account's users of a
// NATS server configuration (deploy/nats/accounts.conf): its permissions as
// the all-in-one gives them, its password as a bcrypt hash.
func TenantUserConf(tenant, password string) (string, error) {
	p, err := TenantPermissions(tenant)
	if err != nil {
		return "", err
	}
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return "", fmt.Errorf("allinone: hash the password of %s: %w", TenantUser(tenant), err)
	}
	quote := func(s []string) string {
		q := make([]string, len(s))
		for i, v := range s {
			q[i] = fmt.Sprintf("%q", v)
		}
		return strings.Join(q, ", ")
	}
	return fmt.Sprintf("{ user: %s, password: %q,\n  permissions: { publish: { allow: [%s] }, subscribe: { allow: [%s] } } }",
		TenantUser(tenant), hash, quote(p.Publish.Allow), quote(p.Subscribe.Allow)), nil
}

// tenantUsersInterval is how often the all-in-one looks for tenant users
// made or removed in its data directory.
const tenantUsersInterval = 2 * time.Second

// withTenantUsers returns the roles' users and a user of each tenant in
// passwords (by user), with its permissions.
func (f *Fabric) withTenantUsers(passwords map[string]string) ([]*server.User, error) {
	// Fresh structs every time: the server writes into the users it is
	// given (their account) while connections read the ones it runs with.
	users := make([]*server.User, 0, len(f.roleUsers)+len(passwords))
	for _, u := range f.roleUsers {
		users = append(users, &server.User{Username: u.Username, Password: u.Password, Permissions: u.Permissions})
	}
	for _, u := range slices.Sorted(maps.Keys(passwords)) {
		perms, err := TenantPermissions(strings.TrimPrefix(u, tenantUserPrefix))
		if err != nil {
			return nil, err
		}
		hash, err := bcrypt.GenerateFromPassword([]byte(passwords[u]), bcrypt.MinCost)
		if err != nil {
			return nil, fmt.Errorf("allinone: hash the NATS password of %s: %w", u, err)
		}
		users = append(users, &server.User{Username: u, Password: string(hash), Permissions: perms})
	}
	return users, nil
}

// watchTenantUsers gives the embedded server the tenant users whose
// password files appear, change or go in the data directory (fabric
// provision -tenant), until ctx ends. A failure is logged and tried again.
func (f *Fabric) watchTenantUsers(ctx context.Context) error {
	t := time.NewTicker(tenantUsersInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		onDisk, err := tenantPasswords(f.opts.DataDir)
		if err == nil && maps.Equal(onDisk, f.tenantPasswords) {
			continue
		}
		var users []*server.User
		if err == nil {
			users, err = f.withTenantUsers(onDisk)
		}
		if err == nil {
			err = f.ns.SetUsers(users)
		}
		if err != nil {
			f.opts.Logger.Error("NATS tenant users", "err", err)
			continue
		}
		f.tenantPasswords = onDisk
		f.opts.Logger.Info("NATS tenant users loaded", "users", slices.Sorted(maps.Keys(onDisk)))
	}
}

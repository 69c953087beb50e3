package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/fabric-mls/fabric/internal/allinone"
	"github.com/fabric-mls/fabric/internal/config"
)

// provision creates the fabric's streams and buckets on a NATS deployment,
// or reports how existing ones differ from what the fabric expects. With
// -tenant it makes that tenant's NATS user instead (issue 27): on the
// all-in-one of -from-data, which loads it while it runs, or as a block for
// a deployment's accounts.conf.
func provision(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		n                config.NATS
		errs             config.Errs
		tenant, fromData string
	)
	fs := flag.NewFlagSet("fabric provision", flag.ContinueOnError)
	fs.SetOutput(stderr)
	n.RegisterFlags(fs, &errs)
	config.String(fs, &tenant, "tenant", "", "make this tenant's NATS user (publish fabric.intake.<tenant> and fabric.operate.<tenant>.*.*, read its own inbox) instead of the streams")
	config.String(fs, &fromData, "from-data", "", "with -tenant: the all-in-one's data folder, where the user's password is written (else a block for accounts.conf is printed)")
	if err := config.Parse(fs, args); err != nil {
		return err
	}
	if tenant != "" {
		return provisionTenant(stdout, tenant, fromData)
	}
	if fromData != "" {
		errs.Addf("-from-data goes with -tenant")
	}
	n.Validate(&errs)
	if err := errs.Err(); err != nil {
		return err
	}
	nc, _, err := n.ConnectJetStream(ctx, "fabric provision")
	if err != nil {
		return err
	}
	nc.Close()
	fmt.Fprintf(stdout, "streams and buckets are provisioned with %d replica(s)\n", n.Replicas)
	return nil
}

// provisionTenant makes tenant's NATS user and says how to connect with it.
func provisionTenant(stdout io.Writer, tenant, fromData string) error {
	user := allinone.TenantUser(tenant)
	perms, err := allinone.TenantPermissions(tenant)
	if err != nil {
		return err
	}
	connect := fmt.Sprintf("connect as %s with inbox prefix %s; it may publish %s and subscribe to %s; a request carries the tenant's bearer token (scope ingest, or the operation's) where the workers require one: operations always, the intake on the all-in-one and with ingest -nats-require-token",
		user, allinone.InboxPrefix(user), strings.Join(perms.Publish.Allow, ", "), strings.Join(perms.Subscribe.Allow, ", "))
	if fromData != "" {
		if _, err := allinone.ProvisionTenantUser(fromData, tenant); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "NATS user %s: password in %s (a running fabric run loads it within seconds)\n%s\n",
			user, allinone.NATSPasswordFile(fromData, user), connect)
		return nil
	}
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	pw := hex.EncodeToString(b)
	conf, err := allinone.TenantUserConf(tenant, pw)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "NATS user %s, password %s (shown once; the block holds only its bcrypt hash)\n%s\nadd to the FABRIC account's users in deploy/nats/accounts.conf:\n%s\n", user, pw, connect, conf)
	return nil
}

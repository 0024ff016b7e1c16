package ferrymq

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestUsersGrantsTokens(t *testing.T) {
	noLeaks(t)
	b := newBroker(t, []string{"FERRYMQ_ADMIN_PASSWORD=admin-secret-1"})
	ctx := testCtx(t)
	if _, err := Connect(ctx, Options{Addr: b.Addr}); !errors.Is(err, ErrAuthenticationFailed) {
		t.Fatalf("anonymous: %v", err)
	}
	if _, err := Connect(ctx, Options{Addr: b.Addr}, WithCredentials("admin", "wrong-password")); !errors.Is(err, ErrAuthenticationFailed) {
		t.Fatalf("wrong password: %v", err)
	}
	admin := connect(t, b.Addr, WithCredentials("admin", "admin-secret-1"))
	if err := admin.AddUser(ctx, "billing", "billing-pass", 0); err != nil {
		t.Fatal(err)
	}
	if err := admin.CreateTopic(ctx, "orders.eu", TopicConfig{Storage: StorageMemory}); err != nil {
		t.Fatal(err)
	}
	if err := admin.CreateTopic(ctx, "audit", TopicConfig{Storage: StorageMemory}); err != nil {
		t.Fatal(err)
	}
	if err := admin.Grant(ctx, "billing", "orders.*", ActionPublish|ActionConsume, 0); err != nil {
		t.Fatal(err)
	}
	if err := admin.Grant(ctx, "billing", "audit", ActionInspect, 0); err != nil {
		t.Fatal(err)
	}
	users, err := admin.ListUsers(ctx)
	if err != nil || len(users) != 2 {
		t.Fatalf("%+v %v", users, err)
	}
	for _, u := range users {
		if u.Name == "billing" && (len(u.Grants) != 2 || u.Roles != 0) {
			t.Fatalf("%+v", u)
		}
		if u.Name == "admin" && u.Roles&RoleAdmin == 0 {
			t.Fatalf("%+v", u)
		}
	}
	billing := connect(t, b.Addr, WithCredentials("billing", "billing-pass"))
	if _, err := billing.Publish(ctx, "orders.eu", Message{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if _, err := billing.Publish(ctx, "audit", Message{Body: []byte("x")}); !errors.Is(err, ErrForbidden) {
		t.Fatalf("publish to audit: %v", err)
	}
	if err := billing.AddUser(ctx, "x", "xxxxxxxxxx", 0); !errors.Is(err, ErrForbidden) {
		t.Fatalf("add user as billing: %v", err)
	}
	if err := admin.Revoke(ctx, "billing", "orders.*", ActionPublish, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := billing.Publish(ctx, "orders.eu", Message{Body: []byte("x")}); !errors.Is(err, ErrForbidden) {
		t.Fatalf("after revoke: %v", err)
	}
	// Tokens: created for oneself, listed, used, revoked.
	tok, err := billing.CreateToken(ctx, "", "ci", time.Time{})
	if err != nil || !strings.HasPrefix(tok.Token, "fmq_") {
		t.Fatalf("%+v %v", tok, err)
	}
	list, err := billing.ListTokens(ctx, "")
	if err != nil || len(list) != 1 || list[0].Name != "ci" || list[0].CreatedMs == 0 {
		t.Fatalf("%+v %v", list, err)
	}
	byToken := connect(t, b.Addr, WithToken(tok.Token))
	if _, err := byToken.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if err := billing.RevokeToken(ctx, "", "ci"); err != nil {
		t.Fatal(err)
	}
	if _, err := Connect(ctx, Options{Addr: b.Addr}, WithToken(tok.Token)); !errors.Is(err, ErrAuthenticationFailed) {
		t.Fatalf("revoked token: %v", err)
	}
	// Password change, then the user goes.
	if err := billing.SetPassword(ctx, "", "new-billing-pass"); err != nil {
		t.Fatal(err)
	}
	if _, err := Connect(ctx, Options{Addr: b.Addr}, WithCredentials("billing", "billing-pass")); !errors.Is(err, ErrAuthenticationFailed) {
		t.Fatalf("old password: %v", err)
	}
	if err := admin.RemoveUser(ctx, "billing"); err != nil {
		t.Fatal(err)
	}
	if _, err := billing.Ping(ctx); !errors.Is(err, ErrAuthenticationFailed) && !errors.Is(err, ErrConnectionLost) {
		t.Fatalf("removed user's connection: %v", err)
	}
}

func TestTLS(t *testing.T) {
	noLeaks(t)
	dir := t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ferrymq test"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalPKCS8PrivateKey(key)
	certPath, keyPath := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600)
	b := newBroker(t, nil, "--tls-cert", certPath, "--tls-key", keyPath)
	ctx := testCtx(t)
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	c := connect(t, b.Addr, WithTLS(&tls.Config{RootCAs: pool}))
	topic := mustTopic(t, c, TopicConfig{Storage: StorageMemory})
	if _, err := c.Publish(ctx, topic, Message{Body: []byte("over tls")}); err != nil {
		t.Fatal(err)
	}
	// A client that does not trust the certificate is refused.
	if _, err := Connect(ctx, Options{Addr: b.Addr}, WithTLS(&tls.Config{})); err == nil {
		t.Fatal("untrusted certificate accepted")
	}
}

package kube_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"io"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/homelab/bootstrap/lab/kube"
	"github.com/homelab/bootstrap/lab/kube/kubetest"
)

// As on Talos, the lab's API server encrypts Secrets in etcd with the
// bundle's secretbox key: an etcd snapshot (what bootstrap backup keeps)
// holds the secretbox envelope, not the value; without a key it holds the
// value as it is.
func TestSecretsAreEncryptedInEtcd(t *testing.T) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		enc       kube.Encryption
		plaintext bool
	}{
		{"secretbox", kube.Encryption{Secretbox: base64.StdEncoding.EncodeToString(key)}, false},
		{"none", kube.Encryption{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			c := kubetest.Start(t, kube.Options{Encryption: tc.enc})
			const value = "etcd-encryption-probe-6b2e"
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default"}, StringData: map[string]string{"v": value}}
			if _, err := c.Client().CoreV1().Secrets("default").Create(ctx, s, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			got, err := c.Client().CoreV1().Secrets("default").Get(ctx, "probe", metav1.GetOptions{})
			if err != nil || string(got.Data["v"]) != value {
				t.Fatalf("reading the Secret back: %v", err)
			}
			r, err := c.EtcdSnapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			snap, err := io.ReadAll(r)
			r.Close()
			if err != nil {
				t.Fatal(err)
			}
			if has := bytes.Contains(snap, []byte(value)); has != tc.plaintext {
				t.Errorf("the etcd snapshot holds the value in plaintext: %v, want %v", has, tc.plaintext)
			}
			if env := bytes.Contains(snap, []byte("k8s:enc:secretbox:v1:key2")); env == tc.plaintext {
				t.Errorf("the etcd snapshot holds a secretbox envelope: %v, want %v", env, !tc.plaintext)
			}
		})
	}
}

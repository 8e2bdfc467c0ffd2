// Package backuptest builds etcd snapshot files for tests that have no
// real etcd: a bbolt database with etcd's key bucket (keys are revisions:
// 8-byte big-endian main revision, '_', 8-byte sub revision, as
// storage/mvcc/revision.go writes them) followed by the database's
// sha256, as etcd's Maintenance.Snapshot streams it. Tests with a real
// etcd (the lab) take real snapshots instead.
package backuptest

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"google.golang.org/protobuf/proto"
)

// Snapshot returns a snapshot whose key bucket holds revisions 1..revisions,
// each creating its own key (its value a marshalled mvccpb.KeyValue).
func Snapshot(t testing.TB, revisions int) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket([]byte("key"))
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucket([]byte("meta")); err != nil {
			return err
		}
		for r := 1; r <= revisions; r++ {
			k := make([]byte, 17)
			binary.BigEndian.PutUint64(k[:8], uint64(r))
			k[8] = '_'
			v, err := proto.Marshal(&mvccpb.KeyValue{Key: fmt.Appendf(nil, "/demo/key-%d", r), CreateRevision: int64(r), ModRevision: int64(r), Version: 1, Value: []byte("value")})
			if err != nil {
				return err
			}
			if err := b.Put(k, v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	return append(data, sum[:]...)
}

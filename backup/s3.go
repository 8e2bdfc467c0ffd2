package backup

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// S3Options say which S3-compatible bucket holds copies, and how to reach it.
type S3Options struct {
	// Endpoint is https://host[:port] (or http:// on a trusted network).
	Endpoint string
	Bucket   string
	// Prefix is prepended to every key as it is (homelab/etcd/ puts copies
	// "in" homelab/etcd; homelab/etcd- names them homelab/etcd-<time>…).
	Prefix string
	Region string
	// PathStyle addresses the bucket as <endpoint>/<bucket>; false as
	// <bucket>.<host> (virtual-hosted), whatever the host.
	PathStyle bool
	// AccessKey and SecretKey sign every request, with SessionToken for
	// temporary credentials; CredentialsSource says where they came from,
	// for messages.
	AccessKey, SecretKey, SessionToken string
	CredentialsSource                  string
	// CAFile holds PEM CA certificates trusted besides the system's.
	CAFile string
	// Now is the clock copies' names are compared with (time.Now when nil).
	Now func() time.Time
}

// S3 is a bucket that holds copies of kept snapshots (and of the secrets
// bundle), each read back and compared before it counts.
type S3 struct {
	c              *minio.Client
	bucket, prefix string
	// credentials names where the keys came from, for messages.
	credentials string
	now         func() time.Time
	// partSize is minio-go's multipart part size (0: its default, 16 MiB
	// and up): a copy larger than one part goes up in parts.
	partSize uint64
}

// metaSHA256 is the user metadata an uploaded copy carries: the sha256 of
// its bytes, compared when it is read back and when it is downloaded.
const metaSHA256 = "Sha256"

// NewS3 returns a client for the bucket; it calls nothing yet.
func NewS3(o S3Options) (*S3, error) {
	u, err := url.Parse(o.Endpoint)
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("S3 endpoint %q: want https://host[:port]", o.Endpoint)
	}
	tr, err := minio.DefaultTransport(u.Scheme == "https")
	if err != nil {
		return nil, err
	}
	if o.CAFile != "" {
		pem, err := os.ReadFile(o.CAFile)
		if err != nil {
			return nil, err
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s holds no PEM certificate", o.CAFile)
		}
		tr.TLSClientConfig.RootCAs = pool
	}
	return newS3(o, u, tr)
}

// newS3 makes the client over the transport tr.
func newS3(o S3Options, u *url.URL, tr http.RoundTripper) (*S3, error) {
	// minio-go v7.4.1's BucketLookupAuto picks virtual-hosted addressing
	// only for AWS, Google and Aliyun hosts (api.go
	// isVirtualHostStyleRequest, pkg/s3utils IsVirtualHostSupported), so
	// pathStyle: false asks for it explicitly (BucketLookupDNS).
	lookup := minio.BucketLookupDNS
	if o.PathStyle {
		lookup = minio.BucketLookupPath
	}
	c, err := minio.New(u.Host, &minio.Options{
		Creds: credentials.NewStaticV4(o.AccessKey, o.SecretKey, o.SessionToken), Secure: u.Scheme == "https", Region: o.Region,
		BucketLookup: lookup, Transport: tr,
	})
	if err != nil {
		return nil, err
	}
	now := o.Now
	if now == nil {
		now = time.Now
	}
	return &S3{c: c, bucket: o.Bucket, prefix: o.Prefix, credentials: o.CredentialsSource, now: now}, nil
}

// URL names a key (or, empty, the prefix) for messages: s3://bucket/key.
func (s *S3) URL(key string) string {
	if key == "" {
		key = s.prefix
	}
	return "s3://" + s.bucket + "/" + key
}

// KeyOf returns the key an s3://<bucket>/<key> URL names in this bucket.
func (s *S3) KeyOf(u string) (string, error) {
	rest, ok := strings.CutPrefix(u, "s3://")
	bucket, key, _ := strings.Cut(rest, "/")
	switch {
	case !ok || key == "":
		return "", fmt.Errorf("%q is not an s3://<bucket>/<key> URL", u)
	case bucket != s.bucket:
		return "", fmt.Errorf("%s is in bucket %s, not in backup.s3's %s", u, bucket, s.bucket)
	}
	return key, nil
}

// Check asks whether the bucket exists with these credentials (a HEAD on
// the bucket): what the precheck runs before anything is uploaded.
func (s *S3) Check(ctx context.Context) error {
	ok, err := s.c.BucketExists(ctx, s.bucket)
	if err != nil {
		return s3Error(s, err)
	}
	if !ok {
		return fmt.Errorf("bucket %s does not exist (bootstrap never creates buckets: create it on the server)", s.bucket)
	}
	return nil
}

// Remote is one copy in the bucket.
type Remote struct {
	Key string
	// Taken is when the snapshot was taken (from its name).
	Taken time.Time
	Size  int64
	// SHA256 is the digest the upload recorded and verified ("" for an
	// object this tool did not upload; List leaves it empty, Newest reads
	// it).
	SHA256 string
}

// Upload puts the file at src under the prefix as name, reads it back and
// compares its sha256 and size with what was sent: only then does the copy
// count. A copy that reads back different is removed. An upload cut short
// leaves no object: S3 makes a PUT (or a completed multipart upload)
// visible whole or not at all, and minio-go aborts the multipart upload
// of one that failed (abortFailedUpload in api-remove.go at v7.4.1).
func (s *S3) Upload(ctx context.Context, src, name string) (Remote, error) {
	f, err := os.Open(src)
	if err != nil {
		return Remote{}, err
	}
	defer f.Close()
	h := sha256.New()
	size, err := io.Copy(h, f)
	if err != nil {
		return Remote{}, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return Remote{}, err
	}
	return s.put(ctx, f, size, sum, name)
}

// put uploads size bytes from r whose sha256 is sum, then verifies them.
func (s *S3) put(ctx context.Context, r io.Reader, size int64, sum, name string) (Remote, error) {
	key := s.prefix + name
	if _, err := s.c.PutObject(ctx, s.bucket, key, r, size, minio.PutObjectOptions{
		ContentType: "application/octet-stream", UserMetadata: map[string]string{metaSHA256: sum}, SendContentMd5: true, PartSize: s.partSize,
	}); err != nil {
		return Remote{}, fmt.Errorf("uploading %s: %w", s.URL(key), s3Error(s, err))
	}
	got, n, err := s.digest(ctx, key, io.Discard)
	if err == nil && (got != sum || n != size) {
		err = fmt.Errorf("read back %d bytes with sha256 %.12s…, sent %d with %.12s…", n, got, size, sum)
		if rerr := s.c.RemoveObject(ctx, s.bucket, key, minio.RemoveObjectOptions{}); rerr != nil {
			err = fmt.Errorf("%w; removing it: %v", err, s3Error(s, rerr))
		}
	}
	if err != nil {
		return Remote{}, fmt.Errorf("verifying %s: %w", s.URL(key), err)
	}
	taken, _ := nameTime(name)
	return Remote{Key: key, Taken: taken, Size: size, SHA256: sum}, nil
}

// digest streams key into w and returns the sha256 and size of what came.
func (s *S3) digest(ctx context.Context, key string, w io.Writer) (string, int64, error) {
	obj, err := s.c.GetObject(ctx, s.bucket, key, minio.GetObjectOptions{})
	if err != nil {
		return "", 0, s3Error(s, err)
	}
	defer obj.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(h, w), obj)
	if err != nil {
		return "", n, s3Error(s, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

// List returns the copies under the prefix whose names end in one of
// suffixes and start with a snapshot time, newest first, and apart from
// them the copies named after now (future): a clock that was wrong when
// one was written, or an object someone else put there. Names are read
// relative to the prefix, so a prefix without a trailing / (homelab/etcd-)
// lists what it uploaded; keys further down (another "directory") are not
// copies of this prefix.
func (s *S3) List(ctx context.Context, suffixes ...string) (copies, future []Remote, err error) {
	now := s.now()
	for obj := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix}) {
		if obj.Err != nil {
			return nil, nil, s3Error(s, obj.Err)
		}
		name, ok := strings.CutPrefix(obj.Key, s.prefix)
		if !ok || strings.Contains(name, "/") || !hasSuffix(name, suffixes) {
			continue
		}
		taken, err := nameTime(name)
		if err != nil {
			continue
		}
		r := Remote{Key: obj.Key, Taken: taken, Size: obj.Size}
		if taken.After(now) {
			future = append(future, r)
			continue
		}
		copies = append(copies, r)
	}
	newestFirst := func(rs []Remote) {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Key > rs[j].Key })
	}
	newestFirst(copies)
	newestFirst(future)
	return copies, future, nil
}

// verified reads the digest the upload of r recorded ("" for an object
// this tool did not write).
func (s *S3) verified(ctx context.Context, r Remote) (Remote, error) {
	st, err := s.c.StatObject(ctx, s.bucket, r.Key, minio.StatObjectOptions{})
	if err != nil {
		return r, s3Error(s, err)
	}
	r.SHA256 = st.UserMetadata[metaSHA256]
	return r, nil
}

// Newest returns the newest copy whose name ends in one of suffixes that
// this tool uploaded and verified (its digest recorded), and the copies
// named after now, which never count; ok is false when there is none.
func (s *S3) Newest(ctx context.Context, suffixes ...string) (r Remote, ok bool, future []Remote, err error) {
	all, future, err := s.List(ctx, suffixes...)
	if err != nil {
		return Remote{}, false, nil, err
	}
	for _, c := range all {
		if c, err = s.verified(ctx, c); err != nil {
			return Remote{}, false, future, err
		}
		if c.SHA256 != "" {
			return c, true, future, nil
		}
	}
	return Remote{}, false, future, nil
}

// Prune keeps the newest keep copies whose names end in one of suffixes
// that this tool uploaded and verified (their digest recorded, Newest),
// removes the older ones of those, oldest first, and returns what it
// removed, and the copies named after now. Those never count toward keep
// nor are removed (a copy named in the future would otherwise outlive
// every real one and push them out), and objects this tool did not write
// are left alone.
func (s *S3) Prune(ctx context.Context, keep int, suffixes ...string) (removed []string, future []Remote, err error) {
	all, future, err := s.List(ctx, suffixes...)
	if err != nil || len(all) <= keep {
		return nil, future, err
	}
	var ours []Remote
	for _, c := range all {
		if c, err = s.verified(ctx, c); err != nil {
			return nil, future, err
		}
		if c.SHA256 != "" {
			ours = append(ours, c)
		}
	}
	if len(ours) <= keep {
		return nil, future, nil
	}
	old := ours[keep:]
	for i := len(old) - 1; i >= 0; i-- {
		if err := s.c.RemoveObject(ctx, s.bucket, old[i].Key, minio.RemoveObjectOptions{}); err != nil {
			return removed, future, s3Error(s, err)
		}
		removed = append(removed, old[i].Key)
	}
	return removed, future, nil
}

// Download writes key into dir as a 0600 file named after it and returns
// its path; the bytes are compared with the sha256 the upload recorded.
func (s *S3) Download(ctx context.Context, key, dir string) (string, error) {
	st, err := s.c.StatObject(ctx, s.bucket, key, minio.StatObjectOptions{})
	if err != nil {
		return "", fmt.Errorf("%s: %w", s.URL(key), s3Error(s, err))
	}
	tmp, err := os.CreateTemp(dir, ".downloading-*")
	if err != nil {
		return "", err
	}
	defer os.Remove(tmp.Name())
	sum, _, err := s.digest(ctx, key, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("downloading %s: %w", s.URL(key), err)
	}
	if want := st.UserMetadata[metaSHA256]; want != "" && want != sum {
		return "", fmt.Errorf("downloading %s: sha256 %.12s…, its upload recorded %.12s…", s.URL(key), sum, want)
	}
	dst := dir + string(os.PathSeparator) + path.Base(key)
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", err
	}
	return dst, nil
}

// nameTime reads the snapshot time a copy's name starts with.
func nameTime(name string) (time.Time, error) {
	stamp, _, _ := strings.Cut(name, ".")
	return time.Parse(timeLayout, stamp)
}

// s3Error says what an S3 error means for the user: the server's code
// (SignatureDoesNotMatch, NoSuchBucket…, the codes of the S3 API's error
// responses) with what to do about it. versitygw answers an unknown access
// key with XAdminUserNotFound where AWS and MinIO say InvalidAccessKeyId
// (seen against the lab's server); both mean refused credentials.
func s3Error(s *S3, err error) error {
	var resp minio.ErrorResponse
	if !errors.As(err, &resp) || resp.Code == "" {
		return err
	}
	switch resp.Code {
	case "NoSuchBucket":
		return fmt.Errorf("bucket %s does not exist (%s; bootstrap never creates buckets: create it on the server)", s.bucket, resp.Code)
	case "SignatureDoesNotMatch", "InvalidAccessKeyId", "XAdminUserNotFound", "AccessDenied", "InvalidToken", "ExpiredToken":
		from := s.credentials
		if from == "" {
			from = "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN) or backup.s3.credentialsFile"
		}
		return fmt.Errorf("the S3 server refused the credentials (%s: %s): check %s", resp.Code, resp.Message, from)
	}
	return fmt.Errorf("%s: %s", resp.Code, resp.Message)
}

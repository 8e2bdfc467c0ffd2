package backup

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// recorder answers every request 200 and keeps where it went.
type recorder struct{ hosts, paths []string }

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.hosts, r.paths = append(r.hosts, req.URL.Host), append(r.paths, req.URL.Path)
	return &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}

// pathStyle: false addresses the bucket as <bucket>.<host> for any host,
// as its doc says; minio-go's automatic lookup would do so only for AWS,
// Google and Aliyun hosts (BucketLookupAuto). true: <host>/<bucket>.
func TestPathStyleSelectsTheAddressing(t *testing.T) {
	u, _ := url.Parse("https://s3.nas.example:9000")
	for _, tc := range []struct {
		pathStyle  bool
		host, path string
	}{
		{false, "backups.s3.nas.example:9000", "/"},
		{true, "s3.nas.example:9000", "/backups/"},
	} {
		rec := &recorder{}
		s, err := newS3(S3Options{Endpoint: u.String(), Bucket: "backups", Region: "us-east-1", PathStyle: tc.pathStyle, AccessKey: "k", SecretKey: "s"}, u, rec)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Check(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(rec.hosts) == 0 || rec.hosts[len(rec.hosts)-1] != tc.host || rec.paths[len(rec.paths)-1] != tc.path {
			t.Errorf("pathStyle %v: asked %v %v, want %s%s", tc.pathStyle, rec.hosts, rec.paths, tc.host, tc.path)
		}
	}
}

package gitsnap

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/go-git/go-git/v5/plumbing/format/pktline"
)

// pkt builds a pkt-line stream from lines ("" is a flush).
func pkt(lines ...string) []byte {
	var b bytes.Buffer
	enc := pktline.NewEncoder(&b)
	for _, l := range lines {
		if l == "" {
			_ = enc.Flush()
			continue
		}
		_ = enc.EncodeString(l)
	}
	return b.Bytes()
}

// FuzzUploadPackRequest feeds arbitrary bodies to the upload-pack request
// parser: it must return a request or an error, never panic, and honour
// its bounds. Run with `make fuzz`; inputs that once failed are kept under
// testdata/fuzz/FuzzUploadPackRequest and run by `go test` as regressions.
func FuzzUploadPackRequest(f *testing.F) {
	h := strings.Repeat("a1", 20)
	f.Add(pkt("want "+h+" multi_ack_detailed side-band-64k thin-pack ofs-delta agent=git/2.39.5\n", "", "done\n"))
	f.Add(pkt("want "+h+"\n", "deepen 1\n", ""))
	f.Add(pkt("want "+h+"\n", "", "have "+h+"\n", "have "+h+"\n", ""))
	f.Add(pkt("want "+h+"\n", "shallow "+h+"\n", "deepen-since 12345\n", "", "done\n"))
	f.Add([]byte("0000"))
	f.Add([]byte("ffff" + strings.Repeat("x", 100)))
	f.Add([]byte("0009want \n0000"))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, haves, _, err := parseUploadPackRequest(bytes.NewReader(body))
		if err != nil {
			return
		}
		if len(req.Wants) == 0 || len(req.Wants) > maxWants || len(haves) > maxHaves {
			t.Fatalf("accepted %d wants and %d haves", len(req.Wants), len(haves))
		}
	})
}

// TestGarbageRequestsGet400: the handler answers garbage with 400 and keeps
// serving (the next real clone works).
func TestGarbageRequestsGet400(t *testing.T) {
	fx, srv, _ := serveFixture(t)
	h := strings.Repeat("a1", 20)
	manyWants := make([]string, 0, maxWants+2)
	for i := 0; i <= maxWants; i++ {
		manyWants = append(manyWants, "want "+h+"\n")
	}
	for name, body := range map[string][]byte{
		"not pkt-lines":   []byte("GET / HTTP/1.1\r\n\r\n"),
		"bad length":      []byte("zzzzwant"),
		"no wants":        pkt("", "done\n"),
		"too many wants":  pkt(append(manyWants, "", "done\n")...),
		"bad have":        pkt("want "+h+"\n", "", "have nothex\n"),
		"unexpected line": pkt("want "+h+"\n", "", "hello\n"),
	} {
		rec := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, srv.URL()+"/git-upload-pack", bytes.NewReader(body))
		srv.ServeHTTP(rec, r)
		if rec.Code != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", name, rec.Code, rec.Body)
		}
	}
	dst := t.TempDir() + "/clone"
	git(t, "", "clone", "-q", srv.URL(), dst)
	checkClone(t, fx, dst)
}

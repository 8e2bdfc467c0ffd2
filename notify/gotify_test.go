package notify

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A Gotify 3 application token (gtfy<ident>.<key>, gotify/server v3.0.0
// auth/token.go) reaches the server: shoutrrr's Gotify service refuses it
// before sending (its validator takes only Gotify 2's 15-character "A…"
// tokens), so bootstrap posts it to Gotify's /message itself, with the
// token in X-Gotify-Key; an error names no token.
func TestGotify3TokenIsSent(t *testing.T) {
	const token = "gtfyhomelab_1.b64SeedOfThirtyTwoBytesXXXXXXXXXXXXXXXXXXXXXXXX"
	var got map[string]any
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/gotify/message" || r.Header.Get("X-Gotify-Key") != token {
			http.Error(w, `{"error":"Unauthorized","errorCode":401}`, http.StatusUnauthorized)
			return
		}
		_ = json.NewDecoder(r.Body).Decode(&got)
		w.Write([]byte(`{"id":1}`))
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	raw := "gotify://" + host + "/gotify/" + token + "?disabletls=yes&priority=7"
	if err := Check([]string{raw}); err != nil {
		t.Fatal(err)
	}
	res := Send([]string{raw}, "nightly postcheck", "2 checks failed")
	if res[0].Err != nil {
		t.Fatalf("send: %v", res[0].Err)
	}
	if got["title"] != "nightly postcheck" || got["message"] != "2 checks failed" || got["priority"] != float64(7) {
		t.Errorf("Gotify got %v", got)
	}
	wrong := "gotify://" + host + "/" + token + "?disabletls=yes"
	res = Send([]string{wrong}, "t", "m")
	if res[0].Err == nil || !strings.Contains(res[0].Err.Error(), "401") || strings.Contains(res[0].Err.Error(), "b64Seed") {
		t.Errorf("a refused send: %v (want the 401, no token)", res[0].Err)
	}
	if err := Check([]string{"gotify://" + host + "/" + token + "?priority=11"}); err == nil || strings.Contains(err.Error(), "b64Seed") {
		t.Errorf("priority 11: %v", err)
	}
}

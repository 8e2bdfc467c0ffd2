package check

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRunAllKeepsOrderAndRunsEverything(t *testing.T) {
	checks := []Check{
		{Name: "a", Run: func(context.Context) (Status, string) { return Failf("down %d", 1) }},
		{Name: "b", Run: func(context.Context) (Status, string) { panic("boom") }},
		{Name: "c", Run: func(context.Context) (Status, string) { return Warnf("90%% RAM") }},
		{Name: "d", Run: func(context.Context) (Status, string) { return Passf("ok") }},
	}
	res := RunAll(context.Background(), checks, 2)
	if len(res) != 4 || res[0].Name != "a" || res[3].Name != "d" {
		t.Fatalf("order: %+v", res)
	}
	if res[1].Status != Fail || !strings.Contains(res[1].Reason, "boom") {
		t.Fatalf("panic not turned into a failure: %+v", res[1])
	}
	if Overall(res) != Fail || Overall(res[2:]) != Warn || Overall(nil) != Pass {
		t.Fatal("overall")
	}
	var buf bytes.Buffer
	if err := Table(&buf, res); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "1 passed, 1 warnings, 2 failed") || !strings.Contains(buf.String(), "WARN") {
		t.Fatalf("table:\n%s", buf.String())
	}
}

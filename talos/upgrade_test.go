package talos

import (
	"errors"
	"strings"
	"testing"
)

func TestPlanUpgrades(t *testing.T) {
	nodes := []Target{{Name: "wk-1", Role: RoleWorker}, {Name: "cp-1", Role: RoleControlPlane}, {Name: "cp-2", Role: RoleControlPlane}, {Name: "cp-3", Role: RoleControlPlane}}
	live := map[string]string{"wk-1": "v1.13.2", "cp-1": "v1.13.2", "cp-2": "v1.13.3", "cp-3": "v1.13.2"}
	steps, err := PlanUpgrades(nodes, live, "v1.13.3", false)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range steps {
		got = append(got, s.String())
	}
	want := []string{
		"upgrade Talos on cp-1 v1.13.2 → v1.13.3 (1/3, control planes first)",
		"upgrade Talos on cp-3 v1.13.2 → v1.13.3 (2/3, control planes first)",
		"upgrade Talos on wk-1 v1.13.2 → v1.13.3 (3/3, workers after the control planes)",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("plan:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	var pe *PlanError
	if _, err := PlanUpgrades(nodes, live, "v1.13.2", false); !errors.As(err, &pe) || !strings.Contains(pe.Reason, "cp-2") || !strings.Contains(pe.Reason, "downgrade is refused") {
		t.Fatalf("downgrade: %v", err)
	}
	if steps, err := PlanUpgrades(nodes, live, "v1.13.2", true); err != nil || len(steps) != 1 || steps[0].Name != "cp-2" {
		t.Fatalf("allowed downgrade: %v %v", steps, err)
	}
	two := []Target{{Name: "cp-1", Role: RoleControlPlane}, {Name: "cp-2", Role: RoleControlPlane}}
	if _, err := PlanUpgrades(two, map[string]string{"cp-1": "v1.13.2", "cp-2": "v1.13.2"}, "v1.13.3", false); !errors.As(err, &pe) || !strings.Contains(pe.Reason, "2 control planes") {
		t.Fatalf("two control planes: %v", err)
	}
	if _, err := PlanUpgrades(nodes, map[string]string{"cp-1": "v1.13.2"}, "v1.13.3", false); err == nil || errors.As(err, &pe) {
		t.Fatalf("unknown versions: %v", err)
	}
}

// A node at the wanted version that runs another schematic (or a stock
// image) is upgraded in place; with no schematic wanted, versions alone count.
func TestPlanSchematicChange(t *testing.T) {
	nodes := []Target{{Name: "cp-1", Role: RoleControlPlane}, {Name: "wk-1", Role: RoleWorker}, {Name: "wk-2", Role: RoleWorker}}
	live := map[string]Running{
		"cp-1": {Version: "v1.13.3", Schematic: "aaaa"},
		"wk-1": {Version: "v1.13.3", Schematic: "bbbb"},
		"wk-2": {Version: "v1.13.3"},
	}
	steps, err := PlanUpgradesTo(nodes, live, Running{Version: "v1.13.3", Schematic: "bbbb"}, false)
	if err != nil || len(steps) != 2 || steps[0].Name != "cp-1" || steps[1].Name != "wk-2" {
		t.Fatalf("steps %+v, %v", steps, err)
	}
	if s := steps[0].String(); !strings.Contains(s, "in place, v1.13.3 with schematic bbbb (was aaaa)") {
		t.Errorf("step reads %q", s)
	}
	if s := steps[1].String(); !strings.Contains(s, "was none: not an Image Factory image") {
		t.Errorf("step reads %q", s)
	}
	if steps, err := PlanUpgradesTo(nodes, live, Running{Version: "v1.13.3"}, false); err != nil || len(steps) != 0 {
		t.Errorf("no schematic wanted: %+v %v", steps, err)
	}
}

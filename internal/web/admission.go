package web

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/drover/drover/internal/fleet"
)

// admitButton is one admission action on the device page.
type admitButton struct {
	Action, Label, Class, Confirm string
}

// admitButtons are the actions that apply to d.
func admitButtons(d fleet.Device) []admitButton {
	var out []admitButton
	waiting := d.EnrollRequest != nil && !d.EnrollRequest.Approved
	switch {
	case d.Admission == "pending":
		out = append(out, admitButton{"approve", "Approve", "", ""},
			admitButton{"reject", "Reject", "secondary", "Reject and delete this pending device?"})
	case waiting:
		out = append(out, admitButton{"approve", "Approve re-enrollment", "", "The requester gets a new token and the current one stops working. Approve?"},
			admitButton{"reject", "Reject re-enrollment", "secondary", ""})
	case d.Admission != "active":
		out = append(out, admitButton{"approve", "Admit again", "", ""})
	}
	if d.Admission != "blocked" {
		out = append(out, admitButton{"block", "Block", "secondary", "Block this device? Everything it sends will be refused."})
	}
	if d.Admission != "decommissioned" {
		out = append(out, admitButton{"decommission", "Decommission", "secondary", "Decommission this device? It will be refused; its history stays."})
	}
	return append(out, admitButton{"delete", "Delete", "danger", "Delete this device and everything stored about it?"})
}

// admitDevice applies an admission action from the device page.
func (h *Handler) admitDevice(w http.ResponseWriter, r *http.Request, s *session) {
	id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
	action, ok := fleet.ParseAction(r.PostFormValue("action"))
	if err != nil || !ok {
		h.notFound(w, r, s, "No such device or action")
		return
	}
	back := Prefix + "devices/" + strconv.FormatUint(id, 10)
	d, err := h.fleet.Admit(r.Context(), id, action, "dashboard@"+r.RemoteAddr)
	switch {
	case errors.Is(err, fleet.ErrNotFound):
		h.notFound(w, r, s, "No device "+strconv.FormatUint(id, 10))
		return
	case errors.Is(err, fleet.ErrNothingToDo):
		h.flash(s, "Nothing to "+string(action)+": "+err.Error())
	case err != nil:
		h.serverError(w, r, s, err)
		return
	case d.ID == 0: // deleted (or a pending device rejected)
		h.flash(s, fmt.Sprintf("Device %d deleted.", id))
		back = Prefix + "devices"
	default:
		h.flash(s, fmt.Sprintf("Device %d: %s done; admission %s.", id, action, d.Admission))
	}
	http.Redirect(w, r, back, http.StatusSeeOther)
}

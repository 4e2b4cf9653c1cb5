"""What the commands share went down a floor, to walcore.backup_common (the families store through it too). The
provider's snapshot operator still takes NothingNew from here."""

from ..backup_common import NothingNew

__all__ = ["NothingNew"]
